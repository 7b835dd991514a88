"""Float64 NumPy references for week 39 (what the grader trusts) and the byte counts of its fusions.

Conventions, one throughout the week:
- elementwise ops act on (..., n) arrays; a bias is an (n,) vector added along the last axis (one per column);
- dropout keeps an element where its uniform draw u satisfies u >= p and scales a kept element by 1 / (1 - p);
  element i (flat index in the contiguous (rows, n) layout) takes draw g = offset + i of the stream of that seed, where
  draw g is word g % 4 of Philox4x32-10 at counter g // 4 (what Triton's `tl.rand4x(seed, g // 4)` returns), so the
  reference reproduces the kernel's mask bit for bit;
- RoPE uses the "rotate half" layout of week 35 (pairs (x_c, x_{c + d/2})), ALiBi week 35's slopes and sign.
"""
import math

import numpy as np

from ..w34_layernorm import reference as norm_ref

# ---------------------------------------------------------------- day 1: bytes and the elementwise roofline
# (owner: day-1/2 section)
STAT_BYTES = 4  # a per-row statistic (mean, rstd) is float32 whatever the tensors' dtype
# What each elementwise op moves besides its (m, n) input and output: extra inputs, "vectors" of n elements and
# "tensors" of m × n, in the tensors' itemsize; side outputs, "stats": one float32 per row each. The exercise file
# shows the learner the same table (solutions/w39_kernel_fusion.py's OPS; a test keeps the two equal).
OPS = {
    "bias":      {"vectors": 1, "tensors": 0, "stats": 0},
    "gelu":      {"vectors": 0, "tensors": 0, "stats": 0},
    "silu":      {"vectors": 0, "tensors": 0, "stats": 0},
    "dropout":   {"vectors": 0, "tensors": 0, "stats": 0},  # the mask is regenerated from (seed, offset)
    "residual":  {"vectors": 0, "tensors": 1, "stats": 0},
    "layernorm": {"vectors": 2, "tensors": 0, "stats": 2},
    "rmsnorm":   {"vectors": 1, "tensors": 0, "stats": 1},
}


def extra_bytes(op: str, m: int, n: int, itemsize: int) -> int:
    """Bytes op moves besides its (m, n) input and output: its extra inputs and its side outputs."""
    counts = OPS[op]
    return (counts["vectors"] * n + counts["tensors"] * m * n) * itemsize + counts["stats"] * m * STAT_BYTES


def fusion_bytes(chain, m: int, n: int, itemsize: int):
    """(unfused, fused) HBM bytes of the elementwise ops `chain` on an (m, n) tensor: unfused, every op reads its
    input and writes its output; fused, the chain's input is read once and its output written once. Every op's
    extra inputs and side outputs move once either way."""
    tensor = m * n * itemsize
    extras = sum(extra_bytes(op, m, n, itemsize) for op in chain)
    return len(chain) * 2 * tensor + extras, 2 * tensor + extras


# The fewest HBM bytes of each fused kernel the week benchmarks, as (m, n) tensors read + written, n-vectors read +
# written, float32 per-row statistics written: each tensor crosses HBM once. The benchmark divides these by every
# kernel's time, the peers' included, so a peer that moves more bytes shows as fewer GB/s.
STAGES = {
    "bias_gelu": (2, 1, 0), "cuda_bias_gelu": (2, 1, 0), "bias_gelu_backward": (3, 2, 0),  # x, dy -> dx; b -> db
    "swiglu": (3, 0, 0), "geglu": (3, 0, 0),                                              # gate, up -> y
    "swiglu_backward": (5, 0, 0), "geglu_backward": (5, 0, 0),                            # gate, up, dy -> dgate, dup
    "dropout_residual": (3, 0, 0), "dropout_residual_backward": (2, 0, 0),                # x, r -> y; dy -> dx
    "dropout_residual_layernorm": (4, 2, 2),            # x, r -> y, h; weight, bias; mean, rstd
    "dropout_residual_layernorm_backward": (4, 3, 0),   # dy, h -> dx, dresidual; weight -> dweight, dbias
}


def stage_bytes(stage: str, m: int, n: int, itemsize: int) -> int:
    tensors, vectors, stats = STAGES[stage]
    return (tensors * m * n + vectors * n) * itemsize + stats * m * STAT_BYTES


# ---------------------------------------------------------------- day 2: bias + activation
# GELU (Hendrycks & Gimpel, "Gaussian Error Linear Units (GELUs)"): z·Φ(z), or 0.5·z·(1 + tanh(√(2/π)·(z + c·z³)))
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
TANH_CUBIC = 0.044715  # c
_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(z, approximate="none", k=SQRT_2_OVER_PI, c=TANH_CUBIC):
    """GELU in float64; `k` and `c` are the tanh form's constants."""
    if approximate == "tanh":
        return 0.5 * z * (1 + np.tanh(k * (z + c * z ** 3)))
    return 0.5 * z * (1 + _erf(z / math.sqrt(2)))


def gelu_grad(z, approximate="none"):
    """dGELU/dz: Φ(z) + z·φ(z), or for the tanh form 0.5·(1 + t) + 0.5·z·(1 − t²)·√(2/π)·(1 + 3c·z²)."""
    if approximate == "tanh":
        t = np.tanh(SQRT_2_OVER_PI * (z + TANH_CUBIC * z ** 3))
        return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * SQRT_2_OVER_PI * (1 + 3 * TANH_CUBIC * z * z)
    return 0.5 * (1 + _erf(z / math.sqrt(2))) + z * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def bias_gelu(x, bias, approximate="none"):
    return (gelu(x + bias, approximate),)


def bias_gelu_backward(x, bias, dy, approximate="none"):
    """(dx, dbias): dx = dy·GELU'(x + bias), dbias = Σ over every row of dx."""
    dx = dy * gelu_grad(x + bias, approximate)
    return dx, dx.reshape(-1, x.shape[-1]).sum(axis=0)


def bias_gelu_backward_scale(x, bias, dy, approximate="none"):
    """The size of the terms each output sums (its grading scale): for dx, |dy| times the size of GELU''s terms,
    0.5·(1 + |erf|) + |z|·φ(z), or 0.5·(1 + |t|) + 0.5·|z|·(1 + t²)·√(2/π)·(1 + 3c·z²) for the tanh form (float32
    loses about one unit of 1 − t² where tanh u is near ±1, as PyTorch's own formula does); for dbias, Σ over rows
    of dx's sizes."""
    z = x + bias
    if approximate == "tanh":
        t = np.tanh(SQRT_2_OVER_PI * (z + TANH_CUBIC * z ** 3))
        terms = 0.5 * (1 + np.abs(t)) + 0.5 * np.abs(z) * (1 + t * t) * SQRT_2_OVER_PI * (1 + 3 * TANH_CUBIC * z * z)
    else:
        terms = 0.5 * (1 + np.abs(_erf(z / math.sqrt(2)))) + np.abs(z) * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    size = np.abs(dy) * terms
    return size, size.reshape(-1, x.shape[-1]).sum(axis=0)


def silu(z):
    with np.errstate(over="ignore"):
        return z / (1 + np.exp(-z))


def silu_grad(z):
    with np.errstate(over="ignore"):
        s = 1 / (1 + np.exp(-z))
    return s * (1 + z * (1 - s))


def matmul_bias_gelu_cost(m: int, n: int, k: int, itemsize: int) -> dict:
    """Fewest HBM bytes and the FLOPs of y = GELU(a @ w + bias) fused: a, w and bias read once, y written once
    (the epilogue's few FLOPs per output are left out). Unfused, y also goes out and back in: + 2·m·n·itemsize."""
    return {"bytes": (m * k + k * n + n + m * n) * itemsize, "flops": 2 * m * n * k}


# ---------------------------------------------------------------- day 3-4: Philox, dropout + residual (+ norm)
# Philox4x32-10: Salmon, Moraes, Dror, Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3" (SC 2011). A counter of
# four 32-bit words goes through ten rounds keyed by two words; Triton's tl.rand4x(seed, counter) keys it with the
# low and high words of the seed, counts with those of the counter, and maps each of the four output words to [0, 1).
# The week's stream of draws uses all four: draw g is word g % 4 of counter g // 4 (tl.rand(seed, c) is word 0 only).
PHILOX_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)  # the round's two multipliers (the paper's M0, M1)
PHILOX_KEY_STEPS = (0x9E3779B9, 0xBB67AE85)    # the key's increment per round: golden ratio, sqrt(3) - 1
_WORD = np.uint64(0xFFFFFFFF)
UNIFORM_SCALE = np.float32(4.6566127342e-10)   # just under 2^-31: the largest 31-bit value maps below 1
SEED_LIMIT = 2 ** 63                           # seeds and counters are non-negative int64


def _mul_hi_lo(multiplier: int, word: np.ndarray):
    """The high and low 32-bit words of multiplier · word (exact in uint64: both factors are 32-bit)."""
    product = np.uint64(multiplier) * word
    return product >> np.uint64(32), product & _WORD


def philox4x32(counter, key, rounds: int = 10):
    """Philox4x32 on arrays of counters: `counter` is four uint32-valued arrays, `key` two ints. Returns four arrays."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for _ in range(rounds):
        hi0, lo0 = _mul_hi_lo(PHILOX_MULTIPLIERS[0], c0)
        hi1, lo1 = _mul_hi_lo(PHILOX_MULTIPLIERS[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + np.uint64(PHILOX_KEY_STEPS[0])) & _WORD
        k1 = (k1 + np.uint64(PHILOX_KEY_STEPS[1])) & _WORD
    return c0, c1, c2, c3


def philox_uniform(seed: int, draws) -> np.ndarray:
    """float32 draws in [0, 1) at the given positions of the stream of that seed, bit for bit what the kernels draw:
    draw g is word g % 4 of Philox4x32-10 at counter g // 4, as Triton's `tl.rand4x(seed, g // 4)` returns it. The
    low and high words of the seed are the key; the counter's low and high words are its first two words (the other
    two are 0); the word, read as an int32 and folded onto [0, 2^31) (x < 0 becomes ~x, which Triton writes as
    -x - 1: the same int32), is scaled by just under 2^-31 in float32."""
    seed = int(seed)
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"philox_uniform: the seed must be in [0, 2^63); got {seed}")
    position = np.asarray(draws, dtype=np.uint64)
    counter, word = position >> np.uint64(2), (position & np.uint64(3)).astype(np.intp)
    zero = np.zeros_like(counter)
    words = philox4x32((counter & _WORD, counter >> np.uint64(32), zero, zero), (seed & 0xFFFFFFFF, seed >> 32))
    chosen = np.choose(word, words) if position.ndim else words[int(word)]
    signed = np.asarray(chosen).astype(np.uint32).view(np.int32)
    folded = np.where(signed < 0, ~signed, signed)
    return folded.astype(np.float32) * UNIFORM_SCALE


def dropout_keep(shape, p: float, seed: int, offset: int = 0) -> np.ndarray:
    """The dropout mask of a contiguous array of `shape`: element i (flat) is kept where draw offset + i of the
    stream of that seed is >= p, compared in float32 as the kernel compares."""
    draws = philox_uniform(seed, np.uint64(offset) + np.arange(int(np.prod(shape)), dtype=np.uint64))
    return (draws >= np.float32(p)).reshape(shape)


def dropout(x, keep, p):
    """Inverted dropout: kept elements scaled by 1 / (1 - p), the others 0."""
    return np.where(keep, x / (1.0 - p), 0.0)


def dropout_residual(x, residual, dy, p, seed, offset=0):
    """(y, dx) of y = residual + dropout(x) and its backward for upstream gradient dy: dx = keep · dy / (1 - p)
    with the forward's mask (the residual's gradient is dy itself)."""
    keep = dropout_keep(x.shape, p, seed, offset)
    return residual + dropout(x, keep, p), dropout(dy, keep, p)


def dropout_residual_scale(x, residual, dy, p, seed, offset=0):
    """The size of the terms each output sums (grading scale): |residual| + |dropout(x)| for y; dx has no sum."""
    keep = dropout_keep(x.shape, p, seed, offset)
    return np.abs(residual) + np.abs(dropout(x, keep, p)), None


def dropout_residual_layernorm(x, residual, weight, bias, p, seed, offset=0, eps=norm_ref.EPS):
    """(y, h, mean, rstd): h = residual + dropout(x), y = LayerNorm(h) · weight + bias (week 34's formula on the
    exact h), mean and rstd per row."""
    h = residual + dropout(x, dropout_keep(x.shape, p, seed, offset), p)
    y, mean, rstd = norm_ref.layernorm(h, weight, bias, eps)
    return y, h, mean, rstd


def dropout_residual_layernorm_scale(x, residual, weight, bias, p, seed, offset=0, eps=norm_ref.EPS):
    """Grading scales of (y, h, mean, rstd): h and mean are sums that may cancel, judged against the size of their
    terms (|residual| + |dropout(x)|, and its mean over the row); y and rstd against their own size."""
    terms = np.abs(residual) + np.abs(dropout(x, dropout_keep(x.shape, p, seed, offset), p))
    return None, terms, terms.mean(axis=-1), None


def dropout_residual_norm_bytes(n_rows: int, n_cols: int, element_size: int, fused: bool) -> int:
    """Fewest HBM bytes of h = residual + dropout(x), y = norm(h), per-row statistics and weights ignored. Fused:
    read x and residual, write h and y. Unfused (dropout, add, norm as three ops): dropout reads x and writes its
    output and a one-byte mask, the add reads that output and the residual and writes h, the norm reads h, writes y."""
    elements = n_rows * n_cols
    if fused:
        return 4 * elements * element_size
    return 7 * elements * element_size + elements


# ---------------------------------------------------------------- day 4-5: attention epilogues, RoPE and ALiBi inside attention
# (owner: day-4/5 attention section)
# Week 35's references, in float64: attention with its masks and ALiBi bias, and RoPE's "rotate half" rotation.
from ..attention_cost import flash_attention_cost  # noqa: E402
from ..w35_attention_blocks import reference as ref35  # noqa: E402


def rotated(x, cos, sin, positions=None):
    """x (B, H, L, d) turned by RoPE at `positions` (default 0 … L - 1): those rows of the (>= L, d/2) tables."""
    positions = np.arange(x.shape[-2]) if positions is None else positions
    return ref35.rope(x, cos[positions], sin[positions])[0]


def _attention_and_lse(scores, v):
    """(o, lse) of masked scores (B, H, M, N), -inf where masked: softmax(scores) v and each row's natural
    log-sum-exp (-inf for a row with no key)."""
    top = scores.max(axis=-1, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    total = np.exp(scores - safe).sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, safe + np.log(np.where(total > 0, total, 1.0)), -np.inf)[..., 0]
    return ref35.softmax_rows(scores) @ v, lse


def attention_with(q, k, v, causal=False, scale=None, slopes=None):
    """(o, lse) of softmax(scale · q kᵀ - slopes[h]·|i - j|, causal or not) v; no ALiBi where slopes is None."""
    scores = ref35.masked_scores(ref35.attention_scores(q, k, scale), causal=causal, alibi_slopes=slopes)
    return _attention_and_lse(scores, v)


def rope_attention(q, k, v, cos, sin, causal=False, scale=None):
    """(o, lse) of attention on q and k rotated by RoPE (query i at position i, key j at j; v as it is): what a
    rotary kernel followed by FlashAttention computes."""
    return attention_with(rotated(q, cos, sin), rotated(k, cos, sin), v, causal=causal, scale=scale)


def alibi_attention(q, k, v, slopes, causal=False, scale=None):
    """(o, lse) of attention with ALiBi's bias -slopes[h]·|i - j| added to the scaled scores (week 35's sign)."""
    return attention_with(q, k, v, causal=causal, scale=scale, slopes=slopes)


def attention_output_projection(q, k, v, w_o, b_o=None, causal=False, scale=None):
    """y (B, M, C) = concat_h(attention of head h) · w_oᵀ (+ b_o): the heads side by side, head h in columns
    h·d … (h+1)·d - 1, through an nn.Linear's (C, H·d) weight."""
    o = attention_with(q, k, v, causal=causal, scale=scale)[0]
    b, h, m, d = o.shape
    y = np.swapaxes(o, 1, 2).reshape(b, m, h * d) @ w_o.T
    return y if b_o is None else y + b_o


def qkv_rope_projection(x, w_qkv, b_qkv, cos, sin, n_heads):
    """(q, k, v), each (B, H, N, d): x (B, N, C) · w_qkvᵀ (+ b_qkv) split as (B, N, 3, H, d), q and k rotated."""
    b, n, c = x.shape
    qkv = x @ w_qkv.T + (0.0 if b_qkv is None else b_qkv)
    q, k, v = np.moveaxis(qkv.reshape(b, n, 3, n_heads, c // n_heads), 2, 0).swapaxes(2, 3)
    return rotated(q, cos, sin), rotated(k, cos, sin), v


def rope_attention_bytes(bh: int, m: int, n: int, d: int, element_size: int, block_m: int = 128,
                         causal: bool = False) -> dict:
    """HBM bytes of RoPE + attention: {"unfused": a rotary kernel reads q and k and writes them rotated, then
    FlashAttention reads them; "fused": FlashAttention alone, rotating tiles as it loads them}. The tables, shared
    by every head, stay in L2 and are left out of both."""
    attention = flash_attention_cost(bh, m, n, d, element_size, block_m, causal)["bytes"]
    return {"unfused": attention + 2 * bh * (m + n) * d * element_size, "fused": attention}


def output_projection_cost(b: int, h: int, m: int, n: int, d: int, c: int, element_size: int, block_m: int = 64,
                           block_c: int = 128, causal: bool = False) -> dict:
    """{"unfused", "fused"} -> {"flops", "bytes"} of attention followed by y = O·W_Oᵀ (W_O (c, h·d)).
    unfused: FlashAttention (writes O and the LSE), then a GEMM that reads O and W_O once and writes y.
    fused: the attention of every head runs once per block of block_c output columns (ceil(c / block_c) times, K
    and V read again each time), W_O is read once per query block, y written once; O is never written."""
    copies, blocks = -(-c // block_c), -(-m // block_m)
    attention = flash_attention_cost(b * h, m, n, d, element_size, block_m, causal)
    o_and_lse = b * h * m * (d * element_size + 4)
    gemm_flops = 2 * b * m * h * d * c
    unfused = {"flops": attention["flops"] + gemm_flops,
               "bytes": attention["bytes"] + (b * m * h * d + c * h * d + b * m * c) * element_size}
    fused = {"flops": copies * attention["flops"] + gemm_flops,
             "bytes": copies * (attention["bytes"] - o_and_lse) + (blocks * b * c * h * d + b * m * c) * element_size}
    return {"unfused": unfused, "fused": fused}
