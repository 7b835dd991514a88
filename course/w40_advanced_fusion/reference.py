"""Float64 NumPy references for week 40 (what the grader trusts): linear attention and its chunked form, block masks
and their tile lists, and the capstone's pre-norm transformer block. CuTe's layout algebra has its own module
(layout.py).

Conventions, one throughout the week: heads are (B, H, N, d) arrays; masks are top-left aligned (query i may see key j
where keep[i, j]); a causal sliding window of W keys keeps i − W < j <= i; a document mask keeps pairs of the same
document.
"""
import numpy as np

from ..w35_attention_blocks import reference as ref35

# ---------------------------------------------------------------- day 3: linear attention
# Katharopoulos et al., "Transformers are RNNs: Fast Autoregressive Transformers with Linear Attention" (2020):
# softmax(q·k) is replaced by a kernel φ(q)·φ(k) with a positive feature map φ, so the sum over keys factors as
# φ(q_i)·(Σ_j φ(k_j) v_jᵀ) and costs O(N d²) instead of O(N² d).
FEATURE_MAPS = ("elu1", "relu")
LINEAR_EPS = 1e-6  # added to every normaliser φ(q_i)·z_i, so a row whose features are all 0 (ReLU) gives 0, not 0/0


def feature_map(x, feature: str = "elu1"):
    """φ(x): elu(x) + 1 (x + 1 above 0, exp(x) below; the paper's choice, always > 0) or relu(x)."""
    if feature == "elu1":
        return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    if feature == "relu":
        return np.maximum(x, 0.0)
    raise ValueError(f"feature_map: unknown feature map {feature!r}; known: {', '.join(FEATURE_MAPS)}")


def linear_attention(q, k, v, feature: str = "elu1", causal: bool = True):
    """o_i = Σ_j (φ(q_i)·φ(k_j)) v_j / (Σ_j φ(q_i)·φ(k_j) + LINEAR_EPS), j over every key (j <= i when causal),
    computed the quadratic way: the (N, N) matrix of φ(q)·φ(k) weights, like attention without the softmax."""
    a = feature_map(q, feature) @ np.swapaxes(feature_map(k, feature), -1, -2)
    if causal:
        a = np.tril(a)
    return (a @ v / (a.sum(axis=-1, keepdims=True) + LINEAR_EPS),)


def linear_attention_reordered(q, k, v, feature: str = "elu1"):
    """The same without a mask, reordered: φ(q)(φ(k)ᵀv) / (φ(q)·Σ_j φ(k_j)): a (d, dv) state instead of (N, N)."""
    phi_q, phi_k = feature_map(q, feature), feature_map(k, feature)
    state, norm = np.swapaxes(phi_k, -1, -2) @ v, phi_k.sum(axis=-2)
    return (phi_q @ state / ((phi_q * norm[..., None, :]).sum(axis=-1, keepdims=True) + LINEAR_EPS),)


def chunk_recurrence(phi_k, v, chunk: int):
    """The states the causal chunked form carries between chunks of `chunk` positions: for chunk c (positions
    c·chunk … c·chunk + chunk − 1), S_c = Σ φ(k_j) v_jᵀ and z_c = Σ φ(k_j) over the positions j BEFORE the chunk
    (S_0 = 0, z_0 = 0; the last chunk may be shorter). Returns (states (..., C, d, dv), norms (..., C, d))."""
    n = phi_k.shape[-2]
    starts = range(0, n, chunk)
    states = np.stack([np.swapaxes(phi_k[..., :s, :], -1, -2) @ v[..., :s, :] for s in starts], axis=-3)
    norms = np.stack([phi_k[..., :s, :].sum(axis=-2) for s in starts], axis=-2)
    return states, norms


def chunked_linear_attention(q, k, v, chunk: int, feature: str = "elu1"):
    """Causal linear attention chunk by chunk: inside a chunk the quadratic form with the causal mask, plus the
    earlier chunks through the carried state: o = (tril(φq φkᵀ) v + φq S_c) / (rowsum(tril(φq φkᵀ)) + φq·z_c + ε)."""
    phi_q, phi_k = feature_map(q, feature), feature_map(k, feature)
    states, norms = chunk_recurrence(phi_k, v, chunk)
    out = np.zeros(q.shape[:-1] + v.shape[-1:])
    for c, s in enumerate(range(0, q.shape[-2], chunk)):
        pq, pk, pv = phi_q[..., s:s + chunk, :], phi_k[..., s:s + chunk, :], v[..., s:s + chunk, :]
        a = np.tril(pq @ np.swapaxes(pk, -1, -2))
        num = a @ pv + pq @ states[..., c, :, :]
        den = a.sum(axis=-1) + (pq * norms[..., c, None, :]).sum(axis=-1) + LINEAR_EPS
        out[..., s:s + chunk, :] = num / den[..., None]
    return (out,)


def linear_attention_flops(bh: int, n: int, d: int, chunk: int) -> int:
    """FLOPs of the chunked causal form (multiply-adds × 2): per chunk the (C, C) scores and their product with v,
    φq times the state and its normaliser, and the state update φkᵀ v."""
    return 2 * bh * n * (chunk * d + chunk * d + d * d + d + d * d)


# ---------------------------------------------------------------- day 4: block masks and tile lists
def token_mask(m: int, n: int, causal: bool = True, window: int | None = None, documents=None):
    """keep[i, j] for M queries and N keys: causal (j <= i), a sliding window of `window` keys (i − window < j, with
    causal; |i − j| < window without), same document (documents: one id per position, M = N)."""
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    keep = np.ones((m, n), dtype=bool)
    if causal:
        keep &= j <= i
    if window is not None:
        keep &= (i - j < window) if causal else (np.abs(i - j) < window)
    if documents is not None:
        documents = np.asarray(documents)
        keep &= documents[:m, None] == documents[None, :n]
    return keep


def tile_lists(keep, block_m: int, block_n: int):
    """The tiles a block-sparse kernel visits, per block of block_m queries: the key tiles (blocks of block_n keys)
    holding at least one kept pair, split into partial tiles (some pair masked, or the tile runs past M or N: the
    kernel applies the mask there) and full tiles (every pair of the whole block_m × block_n tile kept: no mask).
    Returns (partial_count (Tm,), partial_index (Tm, Tn), full_count (Tm,), full_index (Tm, Tn)): each row's tile
    numbers in ascending order, padded with −1."""
    m, n = keep.shape
    tm, tn = -(-m // block_m), -(-n // block_n)
    padded = np.zeros((tm * block_m, tn * block_n), dtype=bool)
    padded[:m, :n] = keep
    tiles = padded.reshape(tm, block_m, tn, block_n)
    kept = tiles.sum(axis=(1, 3))
    out = []
    for listed in (kept > 0) & (kept < block_m * block_n), kept == block_m * block_n:
        index = np.full((tm, tn), -1)
        for r in range(tm):
            cols = np.flatnonzero(listed[r])
            index[r, :len(cols)] = cols
        out += [listed.sum(axis=1), index]
    return tuple(np.asarray(x, dtype=np.float64) for x in out)


def masked_attention(q, k, v, keep, scale=None):
    """(o, lse) of softmax attention where only the pairs keep[i, j] count; a query with no kept key gives o = 0 and
    lse = −inf. Float64."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.where(keep, scale * (q @ np.swapaxes(k, -1, -2)), -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    p = np.exp(s - top)
    total = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        o = np.where(total > 0, (p @ v) / np.where(total > 0, total, 1.0), 0.0)
        lse = np.where(total[..., 0] > 0, np.log(total[..., 0]) + top[..., 0], -np.inf)
    return o, lse


def masked_attention_backward(q, k, v, do, keep, scale=None):
    """(dq, dk, dv) of masked_attention's o for the upstream gradient do. Float64."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    o, lse = masked_attention(q, k, v, keep, scale)
    p = np.where(keep, np.exp(scale * (q @ np.swapaxes(k, -1, -2)) - np.where(np.isfinite(lse), lse, 0.0)[..., None]),
                 0.0)
    dv = np.swapaxes(p, -1, -2) @ do
    ds = p * (do @ np.swapaxes(v, -1, -2) - (do * o).sum(axis=-1, keepdims=True))
    return scale * ds @ k, scale * np.swapaxes(ds, -1, -2) @ q, dv


def visited_pairs(keep, block_m: int, block_n: int) -> int:
    """Query-key pairs a tile-skipping kernel computes: block_m · block_n for every tile it visits (the FLOPs it
    pays), against keep.sum() that the mask needs."""
    partial, _, full, _ = tile_lists(keep, block_m, block_n)
    return int((partial.sum() + full.sum()) * block_m * block_n)


# ---------------------------------------------------------------- day 6: the capstone block
# A pre-norm transformer block (Llama's order): h = x + W_o·attention(RoPE(q), RoPE(k), v) of RMSNorm(x)·w1,
# out = h + W_down(silu(W_gate y) ∘ (W_up y)) with y = RMSNorm(h)·w2. Dropout is 0 in the checks (p = 0 is the
# identity; the kernels' masks are checked in week 39).
NORM_EPS = 1e-5
CAPSTONE_WEIGHTS = ("w_norm1", "w_qkv", "w_o", "w_norm2", "w_gate_up", "w_down")


def rms_norm(x, w, eps: float = NORM_EPS):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def capstone_block(x, w_norm1, w_qkv, w_o, w_norm2, w_gate_up, w_down, n_heads: int, causal: bool = True):
    """out of the block for x (B, N, C); w_qkv (3C, C) stacks q, k, v; w_gate_up (2F, C) stacks gate and up;
    w_down (C, F); RoPE tables of week 35 (base 10000) at positions 0 … N − 1."""
    bsz, n, c = x.shape
    d = c // n_heads
    qkv = (rms_norm(x, w_norm1) @ w_qkv.T).reshape(bsz, n, 3, n_heads, d).transpose(2, 0, 3, 1, 4)
    cos, sin = ref35.rope_tables(n, d)
    q, k = (ref35.rope(t, cos, sin)[0] for t in qkv[:2])
    attn, _ = masked_attention(q, k, qkv[2], token_mask(n, n, causal))
    h = x + attn.transpose(0, 2, 1, 3).reshape(bsz, n, c) @ w_o.T
    gate, up = np.split(rms_norm(h, w_norm2) @ w_gate_up.T, 2, axis=-1)
    return (h + (gate / (1 + np.exp(-gate)) * up) @ w_down.T,)


def torch_block(x, w_norm1, w_qkv, w_o, w_norm2, w_gate_up, w_down, n_heads: int, cos, sin, p: float = 0.0):
    """capstone_block in PyTorch, as a practitioner writes it: F.rms_norm, SDPA (causal), the rotation by slices of the
    (N, d/2) tables cos and sin, F.dropout (p), F.silu; on torch tensors of any dtype and device. The benchmark's peer
    (eager and under torch.compile), the grader's 16-bit rule (in the dtype) and the backward's check (float64
    autograd) all run this one."""
    import torch
    import torch.nn.functional as F
    bsz, n, c = x.shape
    d = c // n_heads
    q, k, v = (F.rms_norm(x, (c,), w_norm1, NORM_EPS) @ w_qkv.T).view(bsz, n, 3, n_heads, d).permute(
        2, 0, 3, 1, 4).unbind(0)

    def turn(t):
        a, b = t[..., :d // 2], t[..., d // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(t.dtype)
    attended = F.scaled_dot_product_attention(turn(q), turn(k), v, is_causal=True)
    h = x + F.dropout(attended.transpose(1, 2).reshape(bsz, n, c) @ w_o.T, p)
    f = w_gate_up.shape[0] // 2
    y = F.rms_norm(h, (c,), w_norm2, NORM_EPS)
    return h + F.dropout((F.silu(y @ w_gate_up[:f].T) * (y @ w_gate_up[f:].T)) @ w_down.T, p)


def capstone_gemms(tokens: int, c: int, f: int) -> dict:
    """The block's matrix products, name -> (M, N, K) of the forward: QKV, O, gate+up, down."""
    return {"qkv": (tokens, 3 * c, c), "o": (tokens, c, c), "gate_up": (tokens, 2 * f, c), "down": (tokens, c, f)}


def capstone_stage_costs(bsz: int, n: int, c: int, f: int, heads: int, itemsize: int = 2) -> dict:
    """stage -> (FLOPs, HBM bytes) of each kernel of the course's block in a training step (solutions'
    capstone_stages, same names): matrix products 2·M·N·K FLOPs (their backward two products), bytes as each kernel's
    fewest (every operand read once, every result written once); elementwise and norm kernels count bytes only."""
    t = bsz * n
    d = c // heads
    attention = 4 * bsz * heads * n * n * d // 2  # causal
    stats = 4 * t  # one float32 per row

    def gemm(m, k, out):
        return 2 * m * k * out, (m * k + k * out + m * out) * itemsize
    costs = {
        "rmsnorm": (0, 2 * t * c * itemsize + stats),
        "qkv projection": gemm(t, c, 3 * c),
        "rope (q and k)": (0, 4 * t * c * itemsize),
        "attention": (attention, 4 * t * c * itemsize + stats),
        "output projection": gemm(t, c, c),
        "dropout + residual + rmsnorm": (0, 4 * t * c * itemsize + stats),
        "gate and up projections": gemm(t, c, 2 * f),
        "swiglu": (0, 3 * t * f * itemsize),
        "down projection": gemm(t, f, c),
        "dropout + residual": (0, 3 * t * c * itemsize),
        "dropout + residual backward": (0, 2 * t * c * itemsize),
        "down projection backward": tuple(2 * x for x in gemm(t, f, c)),
        "swiglu backward": (0, 5 * t * f * itemsize),
        "gate and up projections backward": tuple(2 * x for x in gemm(t, c, 2 * f)),
        "dropout + residual + rmsnorm backward": (0, 8 * t * c * itemsize + stats),
        "output projection backward": tuple(2 * x for x in gemm(t, c, c)),
        "attention backward": (5 * attention // 2, 8 * t * c * itemsize + 2 * stats),
        "rope backward (q and k)": (0, 4 * t * c * itemsize),
        "qkv projection backward": tuple(2 * x for x in gemm(t, c, 3 * c)),
        "rmsnorm backward": (0, 3 * t * c * itemsize + stats),
    }
    return costs


def capstone_step_flops(bsz: int, n: int, c: int, f: int, heads: int) -> int:
    """The FLOPs of one training step of the block: its matrix products and attention, forward and backward."""
    return sum(flops for flops, _ in capstone_stage_costs(bsz, n, c, f, heads).values())


# ---------------------------------------------------------------- day 5: where a kernel sits on the roofline
def roofline_bound(flops, nbytes, ms, peak_tflops: float, peak_gbps: float):
    """Per kernel (arrays of equal shape): arithmetic intensity flops/nbytes (FLOP/byte); the roofline's attainable
    rate min(peak, intensity·bandwidth) in TFLOP/s; the achieved rate flops/time in TFLOP/s; the share of the
    roofline reached, the roofline's least time max(flops/peak, nbytes/bandwidth) over the measured time (for a
    kernel with no FLOPs, its share of the bandwidth); and the bound, 1 where the intensity reaches the ridge point
    peak/bandwidth (compute-bound), else 0 (memory-bound). Williams, Waterman and Patterson, "Roofline: An Insightful
    Visual Performance Model for Multicore Architectures" (2009)."""
    flops, nbytes, ms = (np.asarray(a, dtype=np.float64) for a in (flops, nbytes, ms))
    seconds = ms * 1e-3
    intensity = flops / nbytes
    attainable = np.minimum(peak_tflops, intensity * peak_gbps * 1e-3)
    least = np.maximum(flops / (peak_tflops * 1e12), nbytes / (peak_gbps * 1e9))
    ridge = peak_tflops * 1e3 / peak_gbps
    return intensity, attainable, flops / seconds * 1e-12, least / seconds, (intensity >= ridge).astype(np.float64)
