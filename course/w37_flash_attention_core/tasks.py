"""Graded tasks of week 37. The NumPy exercises are checked against reference.py in float64 (and float32);
the Triton forward against week 35's float64 attention with FlashAttention's test rule in 16 bits.
Adversarial cases: a first tile (m = -inf), rows with no key yet, logits of ±1e4 and all-negative logits
(a running max started at 0 fails there), N = 1, lengths that are no multiple of a block, M != N.
A failure is diagnosed by comparing the output with what each known bug would have produced on the same inputs."""
import math

import numpy as np

from ..grading import Case, GradingError, Task, diagnose, exact, pick, seen
from ..w35_attention_blocks import reference as ref35
from ..w35_attention_blocks.tasks import ALL_DTYPES, MATMULS, SDPA, SOFTMAXES, flash_rule, huge_heads, normal_heads
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


def negative_heads(rng, b, h, m, n, d=64):
    """Every logit large and negative (q >= 0, k <= 0): about -1e4 once scaled. A running max started at 0 underflows."""
    return np.abs(rng.integers(20, 60, (b, h, m, d))).astype(float), -np.abs(rng.integers(20, 60, (b, h, n, d))).astype(float)


# (name, B, H, M, N, d, block_m, block_n)
TILED_SHAPES = [("N = 1", 1, 1, 1, 1, 16, 16, 16), ("odd lengths (2, 3, 37, 37, 16), blocks 16 × 8", 2, 3, 37, 37, 16, 16, 8),
                ("M = 45, N = 70, blocks 8 × 32", 1, 2, 45, 70, 8, 8, 32), ("M = 70, N = 45, blocks 32 × 16", 1, 2, 70, 45, 32, 32, 16)]


def tiled_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for name, b, h, m, n, d, bm, bn in TILED_SHAPES:
            for causal in (False, True):
                q, k = normal_heads(rng, b, h, m, n, d)
                cases.append(Case(f"{'causal' if causal else 'no mask'}, {name}", (q, k, rng.normal(0, 1, (b, h, n, d))),
                                  dtype, kwargs={"block_m": bm, "block_n": bn, "causal": causal}))
        cases.append(Case("huge logits (about ±1e4), causal", (*huge_heads(rng, 1, 1, 20, 20), rng.normal(0, 1, (1, 1, 20, 64))),
                          dtype, kwargs={"block_m": 8, "block_n": 8, "causal": True}))
        cases.append(Case("all logits about -1e4", (*negative_heads(rng, 1, 1, 12, 20), rng.normal(0, 1, (1, 1, 20, 64))),
                          dtype, kwargs={"block_m": 8, "block_n": 8, "causal": False}))
    return cases


def _attention_and_lse(q, k, v, causal=False, **_):
    return ref35.attention(q, k, v, causal=causal), ref35.log_sum_exp(q, k, causal=causal)


def count_cases(rng, dtypes):
    cases = []
    for bh, m, n, d, bm, bn in ((1, 1, 1, 16, 16, 16), (64, 4096, 4096, 128, 128, 64), (3, 100, 37, 64, 32, 16),
                                (2, 37, 100, 8, 16, 32), (16, 1000, 1000, 64, 64, 64)):
        for causal in (False, True):
            cases.append(Case(f"bh={bh}, M={m}, N={n}, d={d}, blocks {bm} × {bn}" + (", causal" if causal else ""), (),
                              "float64", kwargs={"bh": bh, "m": m, "n": n, "d": d, "block_m": bm, "block_n": bn,
                                                 "causal": causal}))
    return cases


def bounds_cases(rng, dtypes):
    cases = []
    for pid_m, bm, bn, n in ((0, 64, 64, 1000), (3, 64, 64, 1000), (15, 64, 64, 1000), (16, 64, 64, 1000), (2, 128, 64, 1000),
                             (1, 64, 128, 1000), (5, 32, 64, 100), (0, 16, 16, 1), (7, 128, 64, 8192), (3, 16, 32, 45),
                             (3, 64, 16, 100), (1, 16, 32, 1000), (2, 64, 32, 150), (6, 16, 64, 100)):
        cases.append(Case(f"pid_m={pid_m}, blocks {bm} × {bn}, N={n}", (), "float64",
                          kwargs={"pid_m": pid_m, "block_m": bm, "block_n": bn, "n": n}))
    return cases


# (name, B, H, M, N, d): the head shapes the forward kernels are swept over (week 38's tensor-core kernel has its own)
FLASH_SHAPES = (("odd lengths (2, 3, 37, 37, 64)", 2, 3, 37, 37, 64), ("M = 45, N = 70, d = 16", 1, 2, 45, 70, 16),
                ("M = 70, N = 45, d = 32", 1, 2, 70, 45, 32), ("d = 100, N = 33", 1, 1, 33, 33, 100),
                ("M = 130, N = 200: several key blocks", 1, 2, 130, 200, 64), ("N = 1", 1, 1, 1, 1, 16))


def flash_cases(rng, dtypes, shapes=FLASH_SHAPES):
    cases = []
    for dtype in dtypes:
        for name, b, h, m, n, d in shapes:
            for causal in (False, True):
                q, k = normal_heads(rng, b, h, m, n, d)
                v = rng.normal(0, 1, (b, h, n, d))
                kw = {"causal": causal}
                cases.append(Case(f"{'causal' if causal else 'no mask'}, {name}", (q, k, v), dtype,
                                  sixteen_bit_rule(q, k, v, dtype, kw), kwargs=kw))
        for name, (q, k), kw, strided in (("huge logits (about ±1e4), causal", huge_heads(rng, 1, 2, 40, 40), {"causal": True}, False),
                                          ("all logits about -1e4", negative_heads(rng, 1, 1, 40, 40), {}, False),
                                          ("non-contiguous q, k, v, causal", normal_heads(rng, 2, 3, 37, 37, 64), {"causal": True}, True)):
            v = rng.normal(0, 1, k.shape)
            tolerance = sixteen_bit_rule(q, k, v, dtype, kw) if dtype != "float32" else _folded_exp2_rule(q, k, v)
            cases.append(Case(name, (q, k, v), dtype, tolerance, kwargs=kw, strided=strided))
    return cases


def sixteen_bit_rule(q, k, v, dtype, kw):
    """FlashAttention's rule for o (week 35), plus 2⁻²⁰·|expected| for the LSE, a float32 value of the size of the
    logits (negligible for o, whose entries are below a few units)."""
    rule = flash_rule(q, k, v, dtype, kw)
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


# ---------------------------------------------------------------- diagnosis: what known bugs produce
# Each *_variants function maps a hint to the forms a known bug's outputs take on the case's own inputs, computed in
# float64 from reference.py's formulas (or a float64 replay of the tiled loop where the bug depends on the tiles);
# `_diagnose` (week 34's) names the bug whose output the learner's matches and leaves out bugs this case cannot tell.
LOG2E = math.log2(math.e)
EXACT = 1e-9  # counts and bounds are integers: a bug matches exactly or not at all


def online_variants(m, l, o, s, v):
    """hint -> [(m, l, o)] of one online-softmax step with a known slip."""
    m_new = np.maximum(m, s.max(axis=1))
    seen = np.isfinite(m_new)
    base = np.where(seen, m_new, 0.0)
    p, alpha = np.exp(s - base[:, None]), np.where(seen, np.exp(m - base), 0.0)
    l_new, l_plain = alpha * l + p.sum(axis=1), l + p.sum(axis=1)
    safe = lambda t: np.where(t > 0, t, 1.0)[:, None]  # noqa: E731
    with np.errstate(all="ignore"):
        p_raw, alpha_raw = np.exp(s - m_new[:, None]), np.exp(m - m_new)  # no guard for a row with no key yet
        l_raw = alpha_raw * l + p_raw.sum(axis=1)
        tile_max = s.max(axis=1)
        l_tile = l * np.exp(m - tile_max) + np.exp(s - tile_max[:, None]).sum(axis=1)
    right_o = (o * (alpha * l)[:, None] + p @ v) / safe(l_new)
    return {
        "the old output was not rescaled: multiply it by l·exp(m_old − m_new) before adding P V, then divide by "
        "the new sum": [(m_new, l_new, (o * l[:, None] + p @ v) / safe(l_new))],
        "o is normalised, so the old output needs its old sum back: o_new = (o·l·exp(m_old − m_new) + P V) / l_new":
            [(m_new, l_new, (o * alpha[:, None] + p @ v) / safe(l_new))],
        "the old sum l was not rescaled: l_new = l·exp(m_old − m_new) + rowsum(P) (and the old output takes the "
        "same factor)":
            [(m_new, l_plain, (o * (alpha * l)[:, None] + p @ v) / safe(l_plain))],
        "the output was not divided by the new sum l_new": [(m_new, l_new, o * (alpha * l)[:, None] + p @ v)],
        "NaN: a row with no key yet has m = -inf, and exp(-inf − (-inf)) is NaN; subtract 0 there instead":
            [(m_new, l_raw, right_o * np.where(np.isnan(l_raw), np.nan, 1.0)[:, None])],
        "m must be the running max, max(m_old, rowmax(S)), not this tile's max": [(tile_max, l_tile, right_o)],
    }


def online_update_hint(case, got, expected):
    index = ("m", "l", "o").index(case.output)
    return diagnose(got, expected, pick(online_variants(*seen(case)), index))


def _forward(q, k, v, keep, scale):
    """(o, lse) of softmax(scale·q kᵀ) v where `keep` (M, N) allows; a row with no key: o = 0, lse = -inf."""
    s = np.where(keep, scale * (q @ np.swapaxes(k, -1, -2)), -np.inf)
    top = s.max(axis=-1, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(s - safe)
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, safe + np.log(np.where(total > 0, total, 1.0)), -np.inf)[..., 0]
    return (e / np.where(total > 0, total, 1.0)) @ v, lse


def _streamed(q, k, v, keep, scale, block_n, rescale_l=True, rescale_acc=True, start_max=-np.inf, normalise=True):
    """(o, lse) of the tiled forward replayed in float64 over key blocks of block_n, with the slips given: the sum
    or the accumulator not rescaled when the max grows, the running max started elsewhere, no final division."""
    s = np.where(keep, scale * (q @ np.swapaxes(k, -1, -2)), -np.inf)
    m = np.full(s.shape[:-1], start_max)
    l, acc = np.zeros(s.shape[:-1]), np.zeros(q.shape[:-1] + v.shape[-1:])
    for start in range(0, s.shape[-1], block_n):
        tile = s[..., start:start + block_n]
        m_new = np.maximum(m, tile.max(axis=-1))
        base = np.where(np.isfinite(m_new), m_new, 0.0)
        p, alpha = np.exp(tile - base[..., None]), np.exp(m - base)
        l = (alpha if rescale_l else 1.0) * l + p.sum(axis=-1)
        acc = (alpha[..., None] if rescale_acc else 1.0) * acc + p @ v[..., start:start + block_n, :]
        m = m_new
    with np.errstate(divide="ignore"):
        lse = np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)
    return (acc / np.where(l > 0, l, 1.0)[..., None] if normalise else acc), lse


def _thread_max(q, k, v, keep, scale):
    """(o, lse) of the CUDA kernel's layout (tiles of 64 keys; thread tx of a row holds keys tx + 16 j and output
    columns 4 tx … 4 tx + 3 of each 64) when each thread keeps the max of its own keys, never the row's."""
    s = np.where(keep, scale * (q @ np.swapaxes(k, -1, -2)), -np.inf)
    n, d = s.shape[-1], v.shape[-1]
    owner = (np.arange(d) % 64) // 4
    m, l = np.full(s.shape[:-1] + (16,), -np.inf), np.zeros(s.shape[:-1] + (16,))
    acc = np.zeros(q.shape[:-1] + (d,))
    for start in range(0, n, 64):
        width = min(64, n - start)
        tile = np.concatenate([s[..., start:start + width], np.full(s.shape[:-1] + (64 - width,), -np.inf)], -1)
        tile = tile.reshape(*s.shape[:-1], 4, 16)  # [j, tx]: key start + 16 j + tx
        m_new = np.maximum(m, tile.max(axis=-2))
        base = np.where(np.isfinite(m_new), m_new, 0.0)
        p, alpha = np.exp(tile - base[..., None, :]), np.exp(m - base)
        l = l * alpha + p.sum(axis=-2)
        acc = acc * alpha[..., owner] + p.reshape(*s.shape[:-1], 64)[..., :width] @ v[..., start:start + width, :]
        m = m_new
    total = l.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(total > 0, m[..., 0] + np.log(np.where(total > 0, total, 1.0)), -np.inf)
    return acc / np.where(total > 0, total, 1.0)[..., None], lse


def _empty_as_nan(o, lse):
    """The other form of a bug that leaves a row with no key: 0 / 0 = NaN where the kernel has no guard."""
    return o * np.where(np.isfinite(lse), 1.0, np.nan)[..., None], lse


def forward_variants(q, k, v, causal=False, block_m=None, block_n=None, **_):
    """hint -> [(o, lse)] of the tiled forward's known bugs on these inputs. The tiles of a kernel are its own
    choice: without block_m, block_n (the NumPy exercise gives them) every usual size is tried."""
    m, n, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(d)
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    mask = (j <= i) if causal else np.ones((m, n), bool)
    block_ms, block_ns = [block_m] if block_m else [16, 32, 64, 128], [block_n] if block_n else [16, 32, 64, 128]
    stop = lambda bm: np.minimum((i // bm + 1) * bm, n)  # noqa: E731 - a causal query block's last key, +1
    o, lse = _forward(q, k, v, mask, scale)
    top = np.where(mask, scale * (q @ np.swapaxes(k, -1, -2)), -np.inf).max(axis=-1)
    out = {
        "the accumulator was not rescaled when the max grew: acc = acc·exp(m_old − m_new) + P V":
            [_streamed(q, k, v, mask, scale, bn, rescale_acc=False) for bn in block_ns],
        "the running sum was not rescaled when the max grew: l = l·exp(m_old − m_new) + rowsum(P)":
            [_streamed(q, k, v, mask, scale, bn, rescale_l=False) for bn in block_ns],
        "neither l nor the accumulator was rescaled (the factor exp(m_old − m_new) came out as 1: was m "
        "overwritten by m_new before it was computed?)":
            [_streamed(q, k, v, mask, scale, bn, rescale_l=False, rescale_acc=False) for bn in block_ns],
        "the output was not divided by l at the end: O = acc / l": [_streamed(q, k, v, mask, scale, n, normalise=False)],
        "the running max starts at 0, not -inf: rows whose logits are all far below 0 underflow to l = 0":
            [f(*_streamed(q, k, v, mask, scale, n, start_max=0.0)) for f in (lambda *t: t, _empty_as_nan)],
        "the scale 1/√d is missing": [_forward(q, k, v, mask, 1.0), _forward(q, k, v, mask, math.log(2))],
        "the scale 1/√d was applied twice": [_forward(q, k, v, mask, scale * scale),
                                             _forward(q, k, v, mask, scale * scale * LOG2E)],
        "the log-sum-exp is in base 2: lse = m + ln(l), the natural log": [(o, lse * LOG2E),
                                                                            (o, top + (lse - top) * LOG2E)],
        "the log-sum-exp is missing the running max: lse = m + log(l)": [(o, lse - top)],
        "the log-sum-exp is missing log(l): lse = m + log(l)": [(o, top)],
        "the CUDA row max was taken over one thread's keys: reduce it over the 16 threads that share the row":
            [_thread_max(q, k, v, mask, scale)],
    }
    for bn in block_ns:  # keys past N in a partial last block: loaded as zeros, logit 0 unless masked
        width = -(-n // bn) * bn
        if width > n:
            pad = lambda t: np.concatenate([t, np.zeros(t.shape[:-2] + (width - n, d))], -2)  # noqa: E731
            keep = (np.arange(width)[None, :] <= i) if causal else np.ones((m, width), bool)
            out.setdefault("the tail block is not masked: keys past N enter the softmax with logit 0 (mask "
                           "cols < N)", []).append(_forward(q, pad(k), pad(v), keep, scale))
        for bm in block_ms:  # a loop that stops at the last whole key block
            limit = (stop(bm) if causal else n) // bn * bn
            out.setdefault("the partial last key block is skipped: the key loop must reach N (or the block's last "
                           "query), partial block included", []).append(_forward(q, k, v, mask & (j < limit), scale))
    if causal:
        out["causal mask off by one: the diagonal was masked (query i sees keys j <= i)"] = \
            [f(*_forward(q, k, v, j < i, scale)) for f in (lambda *t: t, _empty_as_nan)]
        out["causal mask off by one: one key past the diagonal was kept (query i sees keys j <= i)"] = \
            [_forward(q, k, v, j <= i + 1, scale)] + [_forward(q, k, v, (j <= i + 1) & (j < stop(bm)), scale)
                                                      for bm in block_ms]
        out["no causal mask (query i sees keys j <= i)"] = \
            [_forward(q, k, v, np.ones((m, n), bool), scale)] + [_forward(q, k, v, j < stop(bm), scale)
                                                                 for bm in block_ms]
        out["the causal mask compares a key with the query's index inside its block: use its index in the "
            "sequence (block start + i)"] = [_forward(q, k, v, j <= i % bm, scale) for bm in block_ms]
        out["the key loop stops at the block's first query: it must run to its last one, min(first + block_m, N)"] = \
            [f(*_forward(q, k, v, mask & (j < i // bm * bm), scale)) for bm in block_ms
             for f in (lambda *t: t, _empty_as_nan)]
    return out


def forward_hint(case, got, expected):
    index = ("o", "lse").index(case.output)
    with np.errstate(all="ignore"):
        return diagnose(got, expected, pick(forward_variants(*seen(case), **case.kwargs), index))


def count_variants(bh, m, n, d, block_m, block_n, causal=False):
    """hint -> [(reads, writes)] of the traffic count's known slips."""
    firsts = range(0, m, block_m)
    ends = [min(f + block_m, n) if causal else n for f in firsts]  # keys each query block streams
    keys = sum(ends)
    reads, writes = bh * (m * d + 2 * keys * d), bh * (m * d + m)
    count = lambda keys, q=m * d: bh * (q + 2 * keys * d)  # noqa: E731
    out = {
        "K and V are read once per query block (every block streams the keys it needs), not once in all":
            [(count(n), writes), (count(ends[-1]), writes)],
        "O is written once: m·d elements per head, plus one log-sum-exp per query": [(reads, bh * (2 * m * d + m))],
        "the log-sum-exp is written too: one value per query": [(reads, bh * m * d)],
        "a partial last query block is a block too: it reads Q's rows and streams its keys":
            [(count(sum(ends[:m // block_m])), writes), (count(sum(ends[:m // block_m]), m // block_m * block_m * d),
                                                         writes)],
        "V is read along with K: 2 · keys · d per query block": [(bh * (m * d + keys * d), writes)],
        "Q is read once: its block stays on chip while the key blocks stream past":
            [(bh * (sum(min(block_m, m - f) * -(-e // block_n) for f, e in zip(firsts, ends)) * d + 2 * keys * d),
              writes)],
        "the counts are in elements, not bytes: leave out the element size": [(reads * size, writes * size)
                                                                               for size in (2, 4)],
        "each key, query and output row is d elements": [(bh * (m + 2 * keys), bh * 2 * m), (bh * (m + 2 * keys),
                                                                                          writes)],
        "the counts are per head: multiply by bh": [(reads // bh, writes // bh)],
        "a partial key block brings only its real keys: count min(stop, N) keys, not whole blocks":
            [(count(sum(-(-e // block_n) * block_n for e in ends)), writes)],
    }
    if causal:
        out["with a causal mask a query block needs only the keys up to its last query, min(first + block_m, N)"] = \
            [(count(len(ends) * n), writes)]
        out["a causal query block streams the keys up to its last query, min(first + block_m, N), its own "
            "diagonal block included"] = [(count(sum(min(f, n) for f in firsts)), writes),
                                          (count(sum(f + block_m for f in firsts)), writes)]
    return out


def count_hint(case, got, expected):
    variants = count_variants(**case.kwargs)
    return diagnose(got, expected, pick(variants, ("reads", "writes").index(case.output)), rtol=EXACT)


def bounds_variants(pid_m, block_m, block_n, n):
    """hint -> [(free, stop)] of the causal tile bounds' known slips."""
    first, last = pid_m * block_m, (pid_m + 1) * block_m
    free, stop = min(first, n) // block_n * block_n, min(last, n)
    return {
        "free is rounded down to whole key blocks: min(first, N) // block_n · block_n": [(min(first, n), stop)],
        "free never passes N: round min(first, N) down": [(first // block_n * block_n, stop)],
        "free is rounded down, not up: the block holding the first query needs the mask":
            [(-(-min(first, n) // block_n) * block_n, stop)],
        "free counts keys, not key blocks: multiply by block_n": [(min(first, n) // block_n, stop)],
        "stop never passes N: min((pid_m + 1)·block_m, N)": [(free, last)],
        "stop is one past the block's last query, so the diagonal block is loaded: min((pid_m + 1)·block_m, N)":
            [(free, min(first, n))],
        "stop is off by one in the last tile: it is one past the last key, min((pid_m + 1)·block_m, N)":
            [(free, stop - 1), (free, min(last, n - 1)), (free, min(last + 1, n))],
        "stop is a key index, not rounded to whole blocks: the masked loop handles the partial block":
            [(free, -(-stop // block_n) * block_n)],
    }


def bounds_hint(case, got, expected):
    return diagnose(got, expected, pick(bounds_variants(**case.kwargs), ("free", "stop").index(case.output)),
                     rtol=EXACT)


TASKS = {t.id: t for t in [
    Task("w37.online_update", "numpy", ("online_update",), online_update_cases, ref.online_update, outputs=("m", "l", "o"),
         banned=SOFTMAXES + SDPA, hint=online_update_hint, dtypes=NUMPY_DTYPES),
    Task("w37.tiled_attention", "numpy", ("tiled_attention",), tiled_cases, _attention_and_lse, outputs=("o", "lse"),
         banned=SOFTMAXES + SDPA, hint=forward_hint, dtypes=NUMPY_DTYPES),
    Task("w37.hbm_traffic", "numpy", ("hbm_traffic",), count_cases, exact(ref.hbm_traffic), outputs=("reads", "writes"),
         hint=count_hint, dtypes=("float64",)),
    Task("w37.causal_tile_bounds", "numpy", ("causal_tile_bounds",), bounds_cases, exact(ref.causal_tile_bounds),
         outputs=("free", "stop"), hint=bounds_hint, dtypes=("float64",)),
    Task("w37.flash_attention", "triton", ("_attend_blocks", "flash_attention_kernel"), flash_cases, _attention_and_lse,
         outputs=("o", "lse"), banned=SOFTMAXES + SDPA + MATMULS, hint=forward_hint, dtypes=ALL_DTYPES,
         gpu_check=linear_memory),
    Task("w37.cuda_flash_attention", "cuda", ("CUDA_FLASH_ATTENTION_SRC",), flash_cases, _attention_and_lse,
         outputs=("o", "lse"), banned=SOFTMAXES + SDPA + MATMULS, hint=forward_hint, dtypes=ALL_DTYPES,
         gpu_check=linear_memory),
]}
