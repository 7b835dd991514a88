"""Graded tasks of week 37. The NumPy exercises are checked against reference.py in float64 (and float32);
the Triton forward against week 35's float64 attention with FlashAttention's test rule in 16 bits.
Adversarial cases: a first tile (m = -inf), rows with no key yet, logits of ±1e4 and all-negative logits
(a running max started at 0 fails there), N = 1, lengths that are no multiple of a block, M != N."""
import numpy as np

from ..grading import Case, GradingError, Task, exact
from ..w35_attention_blocks import reference as ref35
from ..w35_attention_blocks.tasks import ALL_DTYPES, MATMULS, SDPA, SOFTMAXES, _flash_rule, _heads, _huge_heads
from . import reference as ref

NUMPY_DTYPES = ("float64", "float32")


def _tile_state(rng, rows, d, seen):
    """(m, l, o) after a first tile for `seen` rows; the others have seen no key (m = -inf, l = 0, o = 0)."""
    m = np.where(seen, rng.normal(0, 2, rows), -np.inf)
    l = np.where(seen, rng.uniform(1, 20, rows), 0.0)
    o = np.where(seen[:, None], rng.normal(0, 1, (rows, d)), 0.0)
    return m, l, o


def online_update_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for name, br, bc, d in (("a 16 × 16 tile, d = 8", 16, 16, 8), ("Br = 1, Bc = 1", 1, 1, 4),
                                ("a 5 × 37 tile, d = 64", 5, 37, 64)):
            s, v = rng.normal(0, 3, (br, bc)), rng.normal(0, 1, (bc, d))
            cases.append(Case(f"first tile (m = -inf, l = 0, o = 0), {name}",
                              (*_tile_state(rng, br, d, np.zeros(br, bool)), s, v), dtype))
            cases.append(Case(f"a later tile, {name}", (*_tile_state(rng, br, d, np.ones(br, bool)), s, v), dtype))
        s = rng.normal(0, 3, (6, 10))
        s[:3] = -np.inf  # rows 0-2: every key of this tile masked
        seen = np.array([True, False, True, False, True, True])
        cases.append(Case("fully masked rows in the tile, some with no key before either", (*_tile_state(rng, 6, 8, seen), s,
                                                                                             rng.normal(0, 1, (10, 8))), dtype))
        cases.append(Case("logits of about ±1e4", (*_tile_state(rng, 8, 8, np.ones(8, bool)), rng.uniform(-1e4, 1e4, (8, 12)),
                                                     rng.normal(0, 1, (12, 8))), dtype))
    return cases


def online_update_hint(case, got, expected):
    if np.isnan(got).any():
        return "NaN: a row with no key yet has m = -inf, and exp(-inf - (-inf)) is NaN; subtract 0 there instead."
    return ("the old sum and the old output were accumulated with the old max: both must be rescaled by "
            "exp(m_old - m_new) before the tile's terms are added, and o divided by the new sum.")


def _negative_heads(rng, b, h, m, n, d=64):
    """Every logit large and negative: q >= 0, k <= 0, about -1e3. A running max started at 0 underflows."""
    return np.abs(rng.integers(20, 60, (b, h, m, d))).astype(float), -np.abs(rng.integers(20, 60, (b, h, n, d))).astype(float)


# (name, B, H, M, N, d, block_m, block_n)
TILED_SHAPES = [("N = 1", 1, 1, 1, 1, 16, 16, 16), ("odd lengths (2, 3, 37, 37, 16), blocks 16 × 8", 2, 3, 37, 37, 16, 16, 8),
                ("M = 45, N = 70, blocks 8 × 32", 1, 2, 45, 70, 8, 8, 32), ("M = 70, N = 45, blocks 32 × 16", 1, 2, 70, 45, 32, 32, 16)]


def tiled_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for name, b, h, m, n, d, bm, bn in TILED_SHAPES:
            for causal in (False, True):
                q, k = _heads(rng, b, h, m, n, d)
                cases.append(Case(f"{'causal' if causal else 'no mask'}, {name}", (q, k, rng.normal(0, 1, (b, h, n, d))),
                                  dtype, kwargs={"block_m": bm, "block_n": bn, "causal": causal}))
        cases.append(Case("huge logits (about ±1e4), causal", (*_huge_heads(rng, 1, 1, 20, 20), rng.normal(0, 1, (1, 1, 20, 64))),
                          dtype, kwargs={"block_m": 8, "block_n": 8, "causal": True}))
        cases.append(Case("all logits about -1e3", (*_negative_heads(rng, 1, 1, 12, 20), rng.normal(0, 1, (1, 1, 20, 64))),
                          dtype, kwargs={"block_m": 8, "block_n": 8, "causal": False}))
    return cases


def _attention_and_lse(q, k, v, causal=False, **_):
    scores = ref35.masked_scores(ref35.attention_scores(q, k), causal=causal)
    top = scores.max(axis=-1, keepdims=True)
    lse = (top + np.log(np.exp(scores - top).sum(axis=-1, keepdims=True)))[..., 0]
    return ref35.attention(q, k, v, causal=causal), lse


def count_cases(rng, dtypes):
    cases = []
    for bh, m, n, d, bm, bn in ((1, 1, 1, 16, 16, 16), (64, 4096, 4096, 128, 128, 64), (3, 100, 37, 64, 32, 16),
                                (2, 37, 100, 8, 16, 32), (16, 1000, 1000, 64, 64, 64)):
        for causal in (False, True):
            cases.append(Case(f"bh={bh}, M={m}, N={n}, d={d}, blocks {bm} × {bn}" + (", causal" if causal else ""), (),
                              "float64", kwargs={"bh": bh, "m": m, "n": n, "d": d, "block_m": bm, "block_n": bn,
                                                 "causal": causal}))
    return cases


def count_hint(case, got, expected):
    if got < expected:
        return ("too few: K and V are read once per query block (each block streams all the keys it needs), and "
                "a partial last query block is a block too.")
    return "too many: with a causal mask a query block needs only the keys up to its last query; count the LSE once per query."


def bounds_cases(rng, dtypes):
    cases = []
    for pid_m, bm, bn, n in ((0, 64, 64, 1000), (3, 64, 64, 1000), (15, 64, 64, 1000), (16, 64, 64, 1000), (2, 128, 64, 1000),
                             (1, 64, 128, 1000), (5, 32, 64, 100), (0, 16, 16, 1), (7, 128, 64, 8192), (3, 16, 32, 45)):
        cases.append(Case(f"pid_m={pid_m}, blocks {bm} × {bn}, N={n}", (), "float64",
                          kwargs={"pid_m": pid_m, "block_m": bm, "block_n": bn, "n": n}))
    return cases


def bounds_hint(case, got, expected):
    return ("free: the keys before the block's first query, rounded down to whole key blocks (and never past N); "
            "stop: one past the block's last query, never past N.")


# (name, B, H, M, N, d): the head shapes the forward kernels are swept over (week 38's tensor-core kernel has its own)
FLASH_SHAPES = (("odd lengths (2, 3, 37, 37, 64)", 2, 3, 37, 37, 64), ("M = 45, N = 70, d = 16", 1, 2, 45, 70, 16),
                ("M = 70, N = 45, d = 32", 1, 2, 70, 45, 32), ("d = 100, N = 33", 1, 1, 33, 33, 100),
                ("M = 130, N = 200: several key blocks", 1, 2, 130, 200, 64), ("N = 1", 1, 1, 1, 1, 16))


def flash_cases(rng, dtypes, shapes=FLASH_SHAPES):
    cases = []
    for dtype in dtypes:
        for name, b, h, m, n, d in shapes:
            for causal in (False, True):
                q, k = _heads(rng, b, h, m, n, d)
                v = rng.normal(0, 1, (b, h, n, d))
                kw = {"causal": causal}
                cases.append(Case(f"{'causal' if causal else 'no mask'}, {name}", (q, k, v), dtype,
                                  _sixteen_bit_rule(q, k, v, dtype, kw), kwargs=kw))
        for name, (q, k), kw, strided in (("huge logits (about ±1e4), causal", _huge_heads(rng, 1, 2, 40, 40), {"causal": True}, False),
                                          ("all logits about -1e4", _negative_heads(rng, 1, 1, 40, 40), {}, False),
                                          ("non-contiguous q, k, v, causal", _heads(rng, 2, 3, 37, 37, 64), {"causal": True}, True)):
            v = rng.normal(0, 1, k.shape)
            tolerance = _sixteen_bit_rule(q, k, v, dtype, kw) if dtype != "float32" else _folded_exp2_rule(q, k, v)
            cases.append(Case(name, (q, k, v), dtype, tolerance, kwargs=kw, strided=strided))
    return cases


def _sixteen_bit_rule(q, k, v, dtype, kw):
    """FlashAttention's rule for o (week 35), plus 2⁻²⁰·|expected| for the LSE, a float32 value of the size of the
    logits (negligible for o, whose entries are below a few units)."""
    rule = _flash_rule(q, k, v, dtype, kw)
    if rule is None:
        return None
    return rule[0], 2.0 ** -20, rule[2] + "; + 2⁻²⁰·|expected| for the float32 log-sum-exp"


def _folded_exp2_rule(q, k, v):
    """float32 with large logits: exp2 of scale·log2(e)·(q·k) rounds the base-2 logit t once more than exp of the
    natural logit, an error of about |t|·2⁻²⁴ in the exponent, so each probability carries a relative error up to
    about 8·L·2⁻²⁴ for logits of size L. An output is a sum of p·v: its error is that share of max|v| (not of the
    output, which cancellation can make small); the log-sum-exp's is that share of itself."""
    largest = float(np.abs(ref35.attention_scores(q, k)).max())
    rtol = max(2e-5, 8 * largest * 2.0 ** -24)
    atol = max(1e-6, rtol * float(np.abs(v).max()))
    return (atol, rtol, f"float32, logits up to {largest:.3g}: exp2 with the scale folded in, 8·L·2⁻²⁴ = {rtol:.2g} "
            f"of |expected| and of max|v| ({atol:.2g})")


def linear_memory(fn):
    """On a GPU: reject a "flash" forward whose peak extra memory grows as N² (a (B, H, M, N) buffer somewhere).
    From N = 1024 to 4096 the outputs grow 4×; an N² buffer 16×."""
    import torch
    from ..bench import peak_mb
    extra = {}
    for n in (1024, 4096):
        q, k, v = (torch.randn(1, 8, n, 64, device="cuda", dtype=torch.float16) for _ in range(3))
        extra[n] = peak_mb(lambda: fn(q, k, v))
    growth = extra[4096] / max(extra[1024], 1e-6)
    if growth > 8:
        raise GradingError(f"the output is right, but the memory is not FlashAttention's: from N = 1024 to 4096 "
                           f"(B = 1, H = 8, d = 64, float16) the peak extra memory grew {growth:.1f}× "
                           f"({extra[1024]:.1f} MB → {extra[4096]:.1f} MB); O and the LSE grow 4×, an N × N buffer "
                           f"16×. Is a (B, H, M, N) tensor allocated somewhere?")


TASKS = {t.id: t for t in [
    Task("w37.online_update", "numpy", ("online_update",), online_update_cases, ref.online_update, outputs=("m", "l", "o"),
         banned=SOFTMAXES + SDPA, hint=online_update_hint, dtypes=NUMPY_DTYPES),
    Task("w37.tiled_attention", "numpy", ("tiled_attention",), tiled_cases, _attention_and_lse, outputs=("o", "lse"),
         banned=SOFTMAXES + SDPA, dtypes=NUMPY_DTYPES),
    Task("w37.hbm_traffic", "numpy", ("hbm_traffic",), count_cases, exact(ref.hbm_traffic), outputs=("reads", "writes"),
         hint=count_hint, dtypes=("float64",)),
    Task("w37.causal_tile_bounds", "numpy", ("causal_tile_bounds",), bounds_cases, exact(ref.causal_tile_bounds),
         outputs=("free", "stop"), hint=bounds_hint, dtypes=("float64",)),
    Task("w37.flash_attention", "triton", ("_attend_blocks", "flash_attention_kernel"), flash_cases, _attention_and_lse,
         outputs=("o", "lse"), banned=SOFTMAXES + SDPA + MATMULS, dtypes=ALL_DTYPES, gpu_check=linear_memory),
    Task("w37.cuda_flash_attention", "cuda", ("CUDA_FLASH_ATTENTION_SRC",), flash_cases, _attention_and_lse,
         outputs=("o", "lse"), banned=SOFTMAXES + SDPA + MATMULS, dtypes=ALL_DTYPES, gpu_check=linear_memory),
]}
