"""Graded tasks of week 35: the cases each exercise is swept over, and hints that diagnose its known bugs.

Adversarial cases of every attention exercise: N = 1, lengths that are no multiple of a block,
d in {16, 64, 128}, fully masked rows, logits of ±1e4 and non-contiguous (B, N, H, d) storage.
A failing case is diagnosed by computing what each known bug makes of its own inputs (the float64 references
of reference.py, changed in one place) and naming the bug whose answer the output matches (grading.diagnose).
"""
import numpy as np

from .. import backend
from ..grading import Case, Task, diagnose, seen
from . import reference as ref

SOFTMAXES = tuple(f"{m}.{f}" for m in ("torch", "torch.nn.functional", "torch.Tensor", "torch.special")
                  for f in ("softmax", "log_softmax")) + ("scipy.special.softmax",)
SDPA = ("torch.nn.functional.scaled_dot_product_attention", "torch.nn.functional.multi_head_attention_forward")
MATMULS = ("torch.matmul", "torch.bmm", "torch.einsum", "torch.Tensor.__matmul__", "torch.Tensor.matmul",
           "torch.Tensor.bmm", "torch.baddbmm")
ALL_DTYPES = ("float32", "float16", "bfloat16")
HUGE = 1e4
UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}

# (name, B, H, M, N, d): the head shapes every kernel exercise sweeps.
SHAPES = [
    ("N = 1", 1, 1, 1, 1, 16),
    ("odd lengths (2, 3, 37, 64): not a multiple of any block", 2, 3, 37, 37, 64),
    ("M = 45 queries, N = 70 keys, d = 16", 1, 2, 45, 70, 16),
    ("d = 128, N = 33", 1, 2, 33, 33, 128),
    ("a full block (1, 1, 64, 64, d = 64)", 1, 1, 64, 64, 64),
]
# (name, kwargs builder (B, H, M, N, rng) -> dict): the masks every softmax/attention exercise sweeps.
MASKS = [
    ("no mask", lambda b, h, m, n, rng: {}),
    ("causal", lambda b, h, m, n, rng: {"causal": True}),
    ("key padding", lambda b, h, m, n, rng: {"key_lengths": rng.integers(1, n + 1, b)}),
    ("ALiBi", lambda b, h, m, n, rng: {"alibi_slopes": ref.alibi_slopes(h)}),
    ("causal + padding + ALiBi", lambda b, h, m, n, rng: {"causal": True, "key_lengths": rng.integers(1, n + 1, b),
                                                          "alibi_slopes": ref.alibi_slopes(h)}),
    ("fully masked rows (a batch entry with key length 0)",
     lambda b, h, m, n, rng: {"key_lengths": np.array([0] + [n] * (b - 1)), "causal": True}),
]


def _normal(rng, *shape, sigma=1.0):
    return rng.normal(0, sigma, shape)


def normal_heads(rng, b, h, m, n, d, sigma=1.0):
    return _normal(rng, b, h, m, d, sigma=sigma), _normal(rng, b, h, n, d, sigma=sigma)


def huge_heads(rng, b, h, m, n, d=64):
    """q and k of integers in [-200, 200], d = 64: q·k/8 is about ±1e4 and exact in every dtype (bf16
    holds integers up to 256, fp32 sums them exactly below 2^24), so the logits carry no rounding."""
    return (rng.integers(-200, 201, (b, h, m, d)).astype(np.float64),
            rng.integers(-200, 201, (b, h, n, d)).astype(np.float64))


# ---------------------------------------------------------------- diagnosis: what the known bugs produce
# Every hint of the week is a diagnosis: what each known bug makes of the case's own inputs (grading.seen: as
# rounded to the case's dtype), computed with the float64 references, and the bug whose answer the output matches
# (grading.diagnose: a bug that is a no-op on this case names nothing, bugs it cannot tell apart are all named and
# weighed against the other failing cases). Where no bug's answer fits, a few hints read the output's structure
# (NaN rows, uniform rows) instead.

def _quiet(hint):
    """A hint computes the bugs' answers as they come: overflow, 0/0 and NaN are expected there, not warnings."""
    def quiet(case, got, expected):
        with np.errstate(all="ignore"):
            return hint(case, got, expected)
    quiet.__name__, quiet.__doc__ = hint.__name__, hint.__doc__
    return quiet


def _forms(answers) -> list:
    return [np.asarray(a, dtype=np.float64) for a in (answers if isinstance(answers, list) else [answers])]


def _same(a: np.ndarray, b: np.ndarray, rtol: float = 2e-2) -> bool:
    """a and b agree: the same non-finite entries, and the finite ones within rtol of the larger answer."""
    if a.shape != b.shape:
        return False
    finite = np.isfinite(a)
    if not (finite == np.isfinite(b)).all() or not np.array_equal(a[~finite], b[~finite], equal_nan=True):
        return False
    if not finite.any():
        return True
    size = max(np.abs(a[finite]).max(), np.abs(b[finite]).max(), 1e-30)
    return bool(np.abs(a[finite] - b[finite]).max() <= rtol * size)


def _t(x):
    return np.swapaxes(x, -1, -2)


STRIDES = ("an input is read with the wrong strides: a non-contiguous (B, H, N, d) view (here of (B, N, H, d) "
           "storage) needs each tensor's own batch, head and row strides (x.stride()), not offsets from its shape.")


def _misread(x: np.ndarray) -> list:
    """What a kernel that ignores strides reads of a non-contiguous case's (B, H, N, d) input, whose storage is
    (B, N, H, d): with a contiguous tensor's offsets, and with the batch stride left out (b·H + h head strides).
    Offsets past the storage read 0 (the memory check reports those first)."""
    b, h, n, d = x.shape
    flat = np.ascontiguousarray(np.swapaxes(x, 1, 2)).reshape(-1)
    bi, hi, ni, ci = np.ix_(np.arange(b), np.arange(h), np.arange(n), np.arange(d))
    offsets = [((bi * h + hi) * n + ni) * d + ci, (bi * h + hi) * d + ni * h * d + ci]
    return [np.where(off < flat.size, flat[np.minimum(off, flat.size - 1)], 0.0) for off in offsets]


def _misread_one(inputs: tuple, f) -> list:
    """f(*inputs) with one input at a time (and all at once) read as _misread reads it."""
    out = []
    for way in range(2):
        wrong = [_misread(x)[way] for x in inputs]
        out += [f(*inputs[:i], wrong[i], *inputs[i + 1:]) for i in range(len(inputs))] + [f(*wrong)]
    return out


# -- the masks (apply_masks, the softmaxes, attention) --------------------------------------------------------
DIAGONAL = "causal mask off by one: the diagonal is masked, but query i may attend to key i itself (keep j <= i)."
PAST_DIAGONAL = "causal mask off by one: key i + 1 is kept, but query i sees only the keys j <= i."
NO_CAUSAL = "the causal mask is missing: with causal=True, query i must not see the keys j > i."
REVERSED = "the causal mask is reversed: query i sees the keys j <= i (the lower triangle), not j >= i."
BOTTOM_RIGHT = ("the causal mask is aligned bottom-right (j <= i + N - M): this course aligns it top-left, like "
                "SDPA's is_causal, so query i sees the keys j <= i whatever N - M is.")
PAD_IGNORED = "key padding is missing: the keys j >= key_lengths[b] of batch entry b must be masked."
PAD_QUERIES = "key padding masks keys (columns j >= key_lengths[b]), not queries (rows i >= key_lengths[b])."
PAD_OFF = ("key padding off by one: batch entry b has key_lengths[b] real keys, j = 0 … key_lengths[b] - 1 "
           "(keep j < key_lengths[b]).")
ALIBI_SIGN = "the ALiBi bias has the wrong sign: it is -slope·|i - j|, so that far keys lose weight."
ALIBI_ABS = "the ALiBi distance needs abs: the bias -slope·|i - j| penalises keys on both sides of the query."
ALIBI_HEAD = "each head has its own ALiBi slope: head h uses alibi_slopes[h] (not another head's, nor one for all)."
ALIBI_MISSING = "the ALiBi bias is missing: add -alibi_slopes[h]·|i - j| to each score."
ALIBI_SCALED = "the ALiBi bias is multiplied by the scale too: add -slope·|i - j| after scaling the scores."


def mask_variants(b, h, m, n, key_lengths=None, causal=False, alibi_slopes=None) -> dict:
    """hint -> [(keep, bias), ...]: the kept keys (B, 1, M, N) and the additive bias (1, H, M, N) of each known mask
    bug on these shapes and masks (the true masks where the bug is not); "" -> [the true (keep, bias)]."""
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    lengths = None if key_lengths is None else np.asarray(key_lengths).reshape(b, 1, 1, 1)
    true_causal = (j <= i) if causal else True
    true_pad = (j < lengths) if lengths is not None else True
    slopes = None if alibi_slopes is None else np.asarray(alibi_slopes, dtype=np.float64)
    bias = ref.alibi_bias(m, n, slopes) if slopes is not None else np.zeros((1, h, m, n))

    def mask(c=true_causal, p=true_pad, a=bias):
        return np.ones((b, 1, m, n), bool) & c & p, a

    out = {"": [mask()]}
    if causal:
        out[DIAGONAL], out[PAST_DIAGONAL] = [mask(c=j < i)], [mask(c=j <= i + 1)]
        out[NO_CAUSAL], out[REVERSED] = [mask(c=True)], [mask(c=j >= i)]
        out[BOTTOM_RIGHT] = [mask(c=j <= i + n - m)]
    if lengths is not None:
        out[PAD_IGNORED], out[PAD_QUERIES] = [mask(p=True)], [mask(p=i < lengths)]
        out[PAD_OFF] = [mask(p=j <= lengths), mask(p=j < lengths - 1)]
    if slopes is not None:
        per_head = slopes.reshape(1, -1, 1, 1)
        out[ALIBI_SIGN] = [mask(a=-bias)]
        out[ALIBI_ABS] = [mask(a=-per_head * (i - j)), mask(a=-per_head * (j - i))]
        out[ALIBI_HEAD] = [mask(a=ref.alibi_bias(m, n, wrong)) for wrong in
                           (slopes[::-1], np.full_like(slopes, slopes[0]), np.full_like(slopes, slopes[-1]))]
        if b <= len(slopes):  # the slope of batch entry b instead of head h
            out[ALIBI_HEAD].append(mask(a=-slopes[:b].reshape(b, 1, 1, 1) * np.abs(i - j)))
        out[ALIBI_MISSING] = [mask(a=np.zeros_like(bias))]
    return out


def _empty_rows(shape, key_lengths=None, causal=False, **_) -> np.ndarray:
    """(B, H, M): True where a row keeps no key."""
    b, h, m, n = shape
    return np.broadcast_to(~ref.keep_mask(m, n, b, key_lengths, causal).any(axis=-1)[:, 0][:, None], (b, h, m))


# -- apply_masks: masked scores ----------------------------------------------------------------------------
MASKED_ZERO = "masked scores are set to 0, but exp(0) = 1 still counts: a masked score is -inf."
MASKED_FINITE = ("masked scores are a large finite number (like -1e9), not -inf: a row whose keys are all masked "
                 "would then average them instead of giving zeros. Use -np.inf.")


@_quiet
def masks_hint(case, got, expected):
    (s,) = seen(case)
    variants = mask_variants(*s.shape, **case.kwargs)
    keep, bias = variants.pop("")[0]
    masked = ~np.isfinite(expected)
    if masked.any() and np.isfinite(got[masked]).all() and (got[masked] <= -1e3).all() and \
            _same(np.where(masked, 0.0, got), np.where(masked, 0.0, expected)):
        return MASKED_FINITE
    candidates = {hint: [np.where(k, s + a, -np.inf) for k, a in forms] for hint, forms in variants.items()}
    candidates[MASKED_ZERO] = np.where(keep, s + bias, 0.0)
    return diagnose(got, expected, candidates)


# -- scale + mask + softmax: probabilities -----------------------------------------------------------------
SCALE_MISSING = "the scale is missing: multiply the scores by `scale` (1/√d) before the softmax."
SCALE_TWICE = "the scale is applied twice (scale² = 1/d instead of 1/√d): multiply the scores by it once."
SCALE_INVERTED = "the scores are divided by the scale (multiplied by √d): multiply them by scale = 1/√d."
AXIS = "the softmax is over the wrong axis: normalise each row over the keys (the last axis, j), not over the queries."
BY_MAX = "each row must sum to 1: divide by the row's sum of exponentials, not by its largest one."
NO_MAX = "exp overflows on large logits: subtract the row's max of the scaled, biased scores before exp."
MAX_ONCE = ("the row's max is subtracted in one place but not in the other: p = exp(x - max) / Σ exp(x - max), "
            "the same max in both.")
BLOCK_KEPT = ("keys past the last kept one are not masked up to the end of what was loaded: mask with the kept keys "
              "(j < end), not with the loaded ones.")
NAN_MASKED = ("NaN in rows whose keys are all masked: there max = -inf and exp(-inf - (-inf)) is NaN. Such rows have "
              "probabilities 0 and output 0 (for example, use 0 as the max of a row whose max is -inf).")
OVERFLOW = ("NaN or inf in rows that have kept keys: exp overflowed or a sum was 0. Did you subtract the row's max "
            "of the scaled, biased scores before exp, the same max in every pass, and divide by the sum of those exp?")
FINITE_MASK = ("masked keys got a large finite score (like -1e9 or -1e4) instead of -inf: a row whose keys are all "
               "masked then comes out as a uniform average instead of zeros, and very negative logits can lose to the "
               "mask value. Mask with -inf: a row with no kept key has probabilities 0 and output 0.")


def _float32_softmaxes(x: np.ndarray) -> dict:
    """Softmax of logits x (masked keys -inf) in float32, as a kernel computes it, with the max subtracted in
    neither or only one of the two places (overflow gives the inf and NaN it gives there)."""
    x32 = x.astype(np.float32)
    top = x32.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, np.float32(0))
    with np.errstate(all="ignore"):
        shifted, raw = np.exp(x32 - top), np.exp(x32)

        def ratio(e, terms):
            total = terms.sum(axis=-1, keepdims=True)
            return (e / np.where(total > 0, total, np.float32(1))).astype(np.float64)
        return {NO_MAX: ratio(raw, raw), MAX_ONCE: [ratio(shifted, raw), ratio(raw, shifted)]}


def _kept_prefix(keep: np.ndarray, group: int) -> np.ndarray:
    """keep widened to the end of its group of `group` keys (the kept keys of a row are a prefix j < end): what a
    kernel keeps that masks the keys it did not load rather than the keys it must not keep."""
    n = keep.shape[-1]
    end = keep.sum(axis=-1, keepdims=True)
    return np.arange(n) < np.minimum(-(-end // group) * group, n)


def prob_variants(s, scale=1.0, key_lengths=None, causal=False, alibi_slopes=None) -> dict:
    """hint -> P (or a list of forms) that each known bug of scale + mask + softmax makes of scores s (B, H, M, N)."""
    variants = mask_variants(*s.shape, key_lengths, causal, alibi_slopes)
    keep, bias = variants.pop("")[0]

    def softmax(k=keep, a=bias, sc=scale, axis=-1):
        x = np.where(k, sc * s + a, -np.inf)
        return np.swapaxes(ref.softmax_rows(np.swapaxes(x, axis, -1)), axis, -1)

    out = {hint: [softmax(k, a) for k, a in forms] for hint, forms in variants.items()}
    if alibi_slopes is not None:
        out[ALIBI_SCALED] = softmax(a=scale * bias)
    out[SCALE_MISSING], out[SCALE_TWICE] = softmax(sc=1.0), softmax(sc=scale ** 2)
    out[SCALE_INVERTED], out[AXIS] = softmax(sc=1 / scale), softmax(axis=-2)
    if causal or key_lengths is not None:
        out[BLOCK_KEPT] = [softmax(k=_kept_prefix(keep, g)) for g in (16, 32)]
    out[FINITE_MASK] = [ref.softmax_rows(np.where(keep, scale * s + bias, big)) for big in (-1e9, -1e4, -1e4 * scale)]
    x = np.where(keep, scale * s + bias, -np.inf)
    top = x.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        out[BY_MAX] = np.exp(x - np.where(np.isfinite(top), top, 0.0))
    out.update(_float32_softmaxes(x))
    return out


def _uniform_prefix(rows: np.ndarray) -> bool:
    """Every row of `rows` (R, N) is one value c > 0 on a prefix of its keys and 0 after it, c·(prefix) <= 1: the
    softmax of equal finite logits (over a block that may reach past the row)."""
    for row in rows:
        kept = int(np.count_nonzero(row))
        if not kept or not np.isfinite(row).all() or np.count_nonzero(row[:kept]) != kept:
            return False
        if np.ptp(row[:kept]) > 2e-2 * abs(row[0]) or row[0] < 0 or row[0] * kept > 1.02:
            return False
    return True


@_quiet
def softmax_hint(case, got, expected):
    (s,) = seen(case)
    hint = diagnose(got, expected, prob_variants(s, **case.kwargs))
    if hint:
        return hint
    empty = _empty_rows(s.shape, **case.kwargs)
    if empty.any() and np.isnan(got[empty]).all():
        return NAN_MASKED
    if empty.any() and _uniform_prefix(got[empty]):
        return FINITE_MASK
    kept = ~empty
    return OVERFLOW if not np.isfinite(got[kept]).all() and np.isfinite(expected[kept]).all() else None


# -- GEMMs: scores and tiled matrix products -----------------------------------------------------------------
SCORES_MISSING = "the scores are not scaled: divide q·kᵀ by √d (d is the head dimension, q.shape[-1])."
SCORES_BY_D = "the scores are divided by d (the scale applied twice?): the scale is 1/√d."
SCORES_TIMES = "the scores are multiplied by √d: the scale 1/√d divides them."
SCORES_LENGTH = ("the scores are divided by the square root of a length (√N or √M): the scale is 1/√d, with d "
                 "the head dimension q.shape[-1].")
GEMM_SCALE_MISSING = "the `scale` argument is never applied: multiply each score by it."
GEMM_SCALE_TWICE = ("the scale is applied twice: multiply the scores by `scale` once (it holds 1/√d where it is "
                    "wanted).")
GEMM_SCALE_INVERTED = "the scores are divided by `scale`: multiply them by it."
TILE_B = ("the B tile is read transposed (Bs[kk][tx]): C = A·Bᵀ pairs row i of A with row j of B, so thread "
          "(ty, tx) multiplies As[ty][kk] by Bs[tx][kk].")
LAST_ONLY = ("only the last products count: accumulate with += over the whole K loop, from an accumulator set to 0 "
             "once, before the loop.")
K_TAIL = "the last, partial K tile is skipped: loop while k0 < K and load zeros past K."


def _tile_transposed(a, b, tile):
    """a·bᵀ as a tiled kernel computes it when thread (ty, tx) reads Bs[kk][tx] instead of Bs[tx][kk]: within each
    TILE×TILE tile, c[i, bx·T + tx] sums a[i, k0 + kk]·b[bx·T + kk, k0 + tx] (zeros past the edges)."""
    *batch, m, k = a.shape
    n = b.shape[-2]
    nk, nb = -(-k // tile), -(-n // tile)
    ap = np.zeros((*batch, m, nk * tile))
    ap[..., :k] = a
    bp = np.zeros((*batch, nb * tile, nk * tile))
    bp[..., :n, :k] = b
    c = np.einsum("...mtk,...bktx->...mbx", ap.reshape(*batch, m, nk, tile), bp.reshape(*batch, nb, tile, nk, tile))
    return c.reshape(*batch, m, nb * tile)[..., :n]


def gemm_variants(a, b, scale=None) -> dict:
    """hint -> what each known bug of C = scale · a·bᵀ makes of a (…, M, K), b (…, N, K); scale None: a plain
    product (tiled_matmul), no scale to get wrong."""
    k = a.shape[-1]
    c = a @ _t(b)
    out = {}
    if scale is None:
        scale = 1.0
    else:
        out = {GEMM_SCALE_MISSING: c, GEMM_SCALE_TWICE: [scale ** 2 * c, scale * c / np.sqrt(k)],
               GEMM_SCALE_INVERTED: c / scale}
    tiles = (16, 32, 64)
    out[TILE_B] = [scale * _tile_transposed(a, b, t) for t in (16, 32)]
    out[LAST_ONLY] = [scale * (a[..., k - 1:] @ _t(b[..., k - 1:])), np.zeros_like(c)] + [
        scale * (a[..., (k - 1) // t * t:] @ _t(b[..., (k - 1) // t * t:])) for t in tiles]
    out[K_TAIL] = [scale * (a[..., :k // t * t] @ _t(b[..., :k // t * t])) for t in tiles if k % t]
    return out


@_quiet
def scores_hint(case, got, expected):
    q, k = seen(case)
    d, m, n = q.shape[-1], q.shape[-2], k.shape[-2]
    c = q @ _t(k)
    return diagnose(got, expected, {SCORES_MISSING: c, SCORES_BY_D: c / d, SCORES_TIMES: c * np.sqrt(d),
                                    SCORES_LENGTH: [c / np.sqrt(n), c / np.sqrt(m)]})


def _gemm_hint(case, got, expected, scale=None):
    a, b = seen(case)
    candidates = gemm_variants(a, b, scale)
    if case.strided:
        candidates[STRIDES] = _misread_one((a, b), lambda x, y: (1.0 if scale is None else scale) * (x @ _t(y)))
    return diagnose(got, expected, candidates)


@_quiet
def gemm_hint(case, got, expected):
    """tiled_matmul: C = a·bᵀ."""
    return _gemm_hint(case, got, expected)


@_quiet
def qk_hint(case, got, expected):
    """qk_scores: S = scale · q·kᵀ, scale 1.0 unless the case passes one."""
    return _gemm_hint(case, got, expected, case.kwargs.get("scale", 1.0))


# -- attention: O = P V ------------------------------------------------------------------------------------
PV_SKIP = ("the causal key-block skip of the PV loop stops a block early: a query block needs every key block up to "
           "the one that holds its last row (end = min(N, (pid_m + 1)·BLOCK_M)).")
V_TRANSPOSED = "P is multiplied by Vᵀ: O = P·V, key j along V's rows (v[..., j, :])."
P_STRIDE = ("P's rows are read at the wrong stride: 16-bit probabilities written over float32 scores lie "
            "p.stride(2) = 2N elements apart, not N. Use the row stride you are given.")


def attention_variants(q, k, v, key_lengths=None, causal=False, alibi_slopes=None, strided=False) -> dict:
    """hint -> O (or a list of forms) that each known bug of softmax(mask(q·kᵀ/√d)) V makes of q, k, v."""
    scale = 1 / np.sqrt(q.shape[-1])
    masks = dict(key_lengths=key_lengths, causal=causal, alibi_slopes=alibi_slopes)
    out = {hint: [p @ v for p in _forms(ps)] for hint, ps in prob_variants(q @ _t(k), scale, **masks).items()}
    p = ref.softmax_rows(ref.masked_scores(scale * (q @ _t(k)), **masks))
    m, n = p.shape[-2:]
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    if causal:  # PV skips the key blocks past each query block's last row
        blocks = (16, 32, 64, 128)
        free = ref.softmax_rows(ref.masked_scores(scale * (q @ _t(k)), key_lengths, False, alibi_slopes))
        out[PV_SKIP] = [(p * (j < i // bm * bm)) @ v for bm in blocks]
        out[NO_CAUSAL] += [(free * (j < np.minimum(n, (i // bm + 1) * bm))) @ v for bm in blocks]
    if n == v.shape[-1]:
        out[V_TRANSPOSED] = p @ _t(v)
    if strided:
        out[STRIDES] = _misread_one((q, k, v), lambda x, y, z: ref.attention(x, y, z, **masks))
    return out


def _p_read_at_n(p, v, got) -> bool:
    """The rows of O that a PV kernel gets right when it reads P's rows N apart in a buffer whose rows lie 2N apart:
    even global rows g = bh·M + i read row g/2 of P (times their own head's V); the odd ones read score bits."""
    b, h, m, n = p.shape
    g = np.arange(0, b * h * m, 2)
    rows = p.reshape(-1, n)[g // 2]
    predicted = np.einsum("gn,gnd->gd", rows, v.reshape(b * h, n, -1)[g // m])
    even = got.reshape(b * h * m, -1)[g]
    truth = (p @ v).reshape(b * h * m, -1)[g]
    return len(g) > 1 and _same(even, predicted) and not _same(predicted, truth)


def _uniform_average(rows, v_rows) -> bool:
    """Each row of `rows` (R, d) is c·Σ_{j<K} v_j for a prefix K of its keys, 0 < c·K <= 1 (v_rows: (R, N, d))."""
    for row, vs in zip(rows, v_rows):
        sums = np.cumsum(vs, axis=0)  # (N, d): Σ_{j<=K-1}
        norms = (sums * sums).sum(axis=1)
        c = np.where(norms > 0, sums @ row / np.where(norms > 0, norms, 1.0), 0.0)
        fit = np.abs(c[:, None] * sums - row).max(axis=1) <= 2e-2 * max(np.abs(row).max(), 1e-30)
        if not (fit & (c > 0) & (c * np.arange(1, len(c) + 1) <= 1.02)).any():
            return False
    return True


@_quiet
def attention_hint(case, got, expected):
    q, k, v = seen(case)
    hint = diagnose(got, expected, attention_variants(q, k, v, strided=case.strided, **case.kwargs))
    if hint:
        return hint
    p = ref.softmax_rows(ref.masked_scores(ref.attention_scores(q, k), **case.kwargs))
    if case.dtype in UNIT_ROUNDOFF and _p_read_at_n(p, v, got):
        return P_STRIDE
    empty = _empty_rows(p.shape, **case.kwargs)
    if empty.any() and np.isnan(got[empty]).all():
        return NAN_MASKED
    v_rows = np.broadcast_to(v[:, :, None], (*empty.shape, *v.shape[2:]))  # (B, H, M, N, d): row i's keys
    if empty.any() and _uniform_average(got[empty], v_rows[empty]):
        return FINITE_MASK
    return None


# -- RoPE ------------------------------------------------------------------------------------------------------
ROPE_PAIRS = ("rotate the pairs (x[c], x[c + d/2]), the two halves of the head (the \"rotate half\" layout), not "
              "neighbours (x[2c], x[2c + 1]).")
ROPE_SIGN = "the sign of sin is wrong: y1 = x1·cos - x2·sin and y2 = x2·cos + x1·sin (a rotation by +θ)."
ROPE_HALVES = "the two halves of y are swapped: the first half is x1·cos - x2·sin, the second x2·cos + x1·sin."
ROPE_COS_SIN = "cos and sin are swapped: y1 = x1·cos - x2·sin with cos from the cos table."
ROPE_POSITION = "the position is off by one: position t turns by t·θ_c, row t of the tables (row 0 for the first)."
ROPE_TABLE_ROW = ("the tables are indexed by position: position t of every head and batch entry uses row t of cos "
                  "and sin.")
ROPE_FREQ = ("the rotary frequencies are wrong: θ_c = 10000^(-2c/d) for c = 0 … d/2 - 1, as in the cos and sin "
             "tables you are given.")


def _rotate(x1, x2, cos, sin):
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rope_variants(x, cos, sin) -> dict:
    """hint -> what each known RoPE bug makes of x (B, H, N, d) with the tables cos, sin (N, d/2)."""
    b, h, n, d = x.shape
    half = d // 2
    x1, x2 = x[..., :half], x[..., half:]
    even, odd = x[..., 0::2], x[..., 1::2]
    interleaved = np.stack([even * cos - odd * sin, odd * cos + even * sin], axis=-1).reshape(x.shape)
    neighbours = np.concatenate([x1[..., 1:], np.zeros_like(x1[..., :1])], axis=-1)  # (c, c + 1) in the first half
    t = np.arange(n)[:, None]

    def turned(angles):
        return _rotate(x1, x2, np.cos(angles), np.sin(angles))

    theta = 10000.0 ** (-2.0 * np.arange(half) / d)
    by_row = []  # the table row of head h, of head b·H + h, of batch entry b (rows past the table read 0)
    for row in (np.arange(h)[None, :], np.arange(b)[:, None] * h + np.arange(h)[None, :], np.arange(b)[:, None]):
        row = np.broadcast_to(row, (b, h))
        inside, row = (row < n)[..., None, None], np.minimum(row, n - 1)
        by_row.append(_rotate(x1, x2, np.where(inside, cos[row][:, :, None], 0.0),
                              np.where(inside, sin[row][:, :, None], 0.0)))
    return {ROPE_PAIRS: [interleaved, _rotate(x1, neighbours, cos, sin)],
            ROPE_SIGN: [_rotate(x1, x2, cos, -sin), np.concatenate([x1 * cos + x2 * sin, x2 * cos + x1 * sin], -1),
                        np.concatenate([x1 * cos - x2 * sin, x2 * cos - x1 * sin], -1)],
            ROPE_HALVES: np.concatenate([x2 * cos + x1 * sin, x1 * cos - x2 * sin], -1),
            ROPE_COS_SIN: _rotate(x1, x2, sin, cos),
            ROPE_POSITION: [turned((t + 1) * theta), turned((t - 1) * theta)],
            ROPE_TABLE_ROW: by_row,
            ROPE_FREQ: [turned(t * 10000.0 ** (-e * np.arange(half) / d)) for e in (1.0, 4.0)]}


@_quiet
def rope_hint(case, got, expected):
    x, cos, sin = seen(case)
    candidates = rope_variants(x, cos, sin)
    if case.strided:
        candidates[STRIDES] = [ref.rope(wrong, cos, sin)[0] for wrong in _misread(x)]
    return diagnose(got, expected, candidates)


# ---------------------------------------------------------------- NumPy exercises
def scores_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for name, b, h, m, n, d in SHAPES:
            cases.append(Case(name, normal_heads(rng, b, h, m, n, d), dtype))
        cases.append(Case("non-contiguous q, k: (B, N, H, d) storage", normal_heads(rng, 2, 3, 37, 37, 64), dtype,
                          strided=True))
        cases.append(Case(f"huge scores (about ±{HUGE:g})", huge_heads(rng, 1, 2, 9, 11), dtype))
    return cases


def masks_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for shape_name, b, h, m, n, _ in SHAPES[:3]:
            for mask_name, kwargs in MASKS:
                cases.append(Case(f"{mask_name}, {shape_name}", (_normal(rng, b, h, m, n, sigma=3),), dtype,
                                  kwargs=kwargs(b, h, m, n, rng)))
        cases.append(Case("causal, non-contiguous scores", (_normal(rng, 2, 3, 37, 37, sigma=3),), dtype,
                          kwargs={"causal": True}, strided=True))
    return cases


# ---------------------------------------------------------------- GEMM kernels (CUDA C and Triton)
def _gemm_scale(a, b, scale=1.0):
    """Σ_k |a_ik b_jk|: the size of the terms each score sums (cancellation is judged against it)."""
    return (abs(scale) * (np.abs(a) @ np.swapaxes(np.abs(b), -1, -2)),)


def gemm_cases(with_scale: bool):
    def cases(rng, dtypes):
        out = []
        for dtype in dtypes:
            for name, b, h, m, n, d in SHAPES + [("K = 100: the last K tile is partial", 1, 2, 40, 33, 100)]:
                kwargs = {"scale": 1 / np.sqrt(d)} if with_scale and d != 64 else {}
                out.append(Case(name, normal_heads(rng, b, h, m, n, d), dtype, kwargs=kwargs))
            out.append(Case("non-contiguous inputs: (B, N, H, d) storage", normal_heads(rng, 2, 3, 37, 45, 64), dtype,
                            strided=True))
        return out
    return cases


# ---------------------------------------------------------------- fused scale + mask + softmax
def _masks_for(shape_name: str) -> list:
    """The masks swept on a shape. Each mask alone is swept on the odd lengths and on M != N; the other shapes
    (d = 128, a full block) take the ones that combine masks, as the interpreter's time goes to rows."""
    if shape_name in [name for name, *_ in SHAPES[:3]]:
        return MASKS
    return [(name, kwargs) for name, kwargs in MASKS if name not in ("key padding", "ALiBi")]


def softmax_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for shape_name, b, h, m, n, d in SHAPES[:4]:
            for mask_name, kwargs in _masks_for(shape_name):
                cases.append(Case(f"{mask_name}, {shape_name}", (_normal(rng, b, h, m, n, sigma=3),), dtype,
                                  kwargs={"scale": 1 / np.sqrt(d), **kwargs(b, h, m, n, rng)}))
        s = rng.uniform(-HUGE, HUGE, (1, 2, 7, 300))
        cases.append(Case(f"huge logits: uniform in ±{HUGE:g}, scale 1/8, causal", (s,), dtype,
                          kwargs={"scale": 0.125, "causal": True}))
        cases.append(Case("long rows (1, 1, 3, 3000), key padding", (_normal(rng, 1, 1, 3, 3000, sigma=3),), dtype,
                          kwargs={"scale": 0.125, "key_lengths": np.array([2999])}))
        cases.append(Case("non-contiguous scores (2, 3, 19, 37), causal", (_normal(rng, 2, 3, 19, 37, sigma=3),),
                          dtype, kwargs={"scale": 0.125, "causal": True}, strided=True))
    return cases


# ---------------------------------------------------------------- composed attention
def _sdpa_error(q, k, v, dtype, kwargs):
    """Max error of PyTorch's own SDPA (math backend) in `dtype` against the float64 reference: the
    scale of FlashAttention's test rule."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    t = [torch.from_numpy(a).to(backend.DEVICE, getattr(torch, dtype)) for a in (q, k, v)]
    rounded = [x.double().cpu().numpy() for x in t]
    b, h, m, n = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    bias = ref.masked_scores(np.zeros((b, h, m, n)), kwargs.get("key_lengths"), kwargs.get("causal", False),
                             kwargs.get("alibi_slopes"))
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(
            *t, attn_mask=torch.from_numpy(bias).to(backend.DEVICE, getattr(torch, dtype)))
    expected = ref.attention(*rounded, **kwargs)
    return float(np.nan_to_num(np.abs(out.double().cpu().numpy() - expected), nan=0.0).max()), expected


def flash_rule(q, k, v, dtype, kwargs):
    if dtype == "float32":
        return None
    err_pt, expected = _sdpa_error(q, k, v, dtype, kwargs)
    floor = UNIT_ROUNDOFF[dtype] * float(np.abs(expected).max(initial=0.0)) + 1e-5
    return (2 * err_pt + floor, 0.0, f"FlashAttention's rule: 2 × PyTorch's own {dtype} SDPA error "
            f"({err_pt:.2g}) + one rounding of the largest output ({floor:.2g})")


def attention_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for shape_name, b, h, m, n, d in SHAPES[1:]:
            for mask_name, kwargs in _masks_for(shape_name):
                q, k = normal_heads(rng, b, h, m, n, d)
                v = _normal(rng, b, h, n, d)
                kw = kwargs(b, h, m, n, rng)
                cases.append(Case(f"{mask_name}, {shape_name}", (q, k, v), dtype, flash_rule(q, k, v, dtype, kw),
                                  kwargs=kw))
        extra = [("N = 1", *normal_heads(rng, 1, 1, 1, 1, 16), _normal(rng, 1, 1, 1, 16), {}, False),
                 (f"huge logits (about ±{HUGE:g}), causal", *huge_heads(rng, 1, 2, 20, 20),
                  _normal(rng, 1, 2, 20, 64), {"causal": True}, False),
                 ("non-contiguous q, k, v, causal + padding", *normal_heads(rng, 2, 3, 37, 37, 64),
                  _normal(rng, 2, 3, 37, 64), {"causal": True, "key_lengths": np.array([37, 20])}, True)]
        for name, q, k, v, kw, strided in extra:
            cases.append(Case(name, (q, k, v), dtype, flash_rule(q, k, v, dtype, kw), kwargs=kw, strided=strided))
    return cases


# ---------------------------------------------------------------- RoPE
def rope_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for name, b, h, _, n, d in SHAPES[:4] + [("300 positions, d = 64", 1, 2, 300, 300, 64)]:
            cases.append(Case(name, (_normal(rng, b, h, n, d), *ref.rope_tables(n, d)), dtype))
        cases.append(Case("non-contiguous x: (B, N, H, d) storage", (_normal(rng, 2, 3, 37, 64),
                                                                     *ref.rope_tables(37, 64)), dtype, strided=True))
    return cases


TASKS = {t.id: t for t in [
    Task("w35.attention_scores", "numpy", ("attention_scores",), scores_cases,
         lambda q, k: (ref.attention_scores(q, k),), banned=SDPA, hint=scores_hint, dtypes=("float64", "float32"),
         scale=lambda q, k: _gemm_scale(q, k, 1 / np.sqrt(q.shape[-1]))),
    Task("w35.apply_masks", "numpy", ("apply_masks",), masks_cases, lambda s, **kw: (ref.masked_scores(s, **kw),),
         banned=SDPA, hint=masks_hint, dtypes=("float64", "float32")),
    Task("w35.tiled_matmul", "cuda", ("TILED_MATMUL_SRC",), gemm_cases(False),
         lambda a, b: (a @ np.swapaxes(b, -1, -2),), writes_out=True, banned=MATMULS, hint=gemm_hint,
         dtypes=ALL_DTYPES, scale=_gemm_scale, out_shape=lambda a, b: (*a[:3], b[2])),
    Task("w35.qk_scores", "triton", ("qk_scores_kernel",), gemm_cases(True),
         lambda q, k, scale=1.0: (scale * (q @ np.swapaxes(k, -1, -2)),), writes_out=True, banned=MATMULS,
         hint=qk_hint, dtypes=ALL_DTYPES, scale=_gemm_scale, out_shape=lambda q, k: (*q[:3], k[2])),
    Task("w35.scale_mask_softmax", "triton", ("scale_mask_softmax_kernel", "masked_row_softmax"), softmax_cases,
         ref.scale_mask_softmax, outputs=("p",), writes_out=True, banned=SOFTMAXES + SDPA, hint=softmax_hint,
         dtypes=ALL_DTYPES),
    Task("w35.cuda_scale_mask_softmax", "cuda", ("CUDA_SCALE_MASK_SOFTMAX_SRC",), softmax_cases,
         ref.scale_mask_softmax, outputs=("p",), writes_out=True, banned=SOFTMAXES + SDPA, hint=softmax_hint,
         dtypes=ALL_DTYPES),
    Task("w35.attention", "triton", ("pv_kernel", "attention"), attention_cases,
         lambda q, k, v, **kw: (ref.attention(q, k, v, **kw),), outputs=("o",), writes_out=True,
         banned=SOFTMAXES + SDPA + MATMULS, hint=attention_hint, dtypes=ALL_DTYPES,
         scale=lambda q, k, v, **kw: (ref.attention_scale(q, k, v, **kw),)),
    Task("w35.rope", "triton", ("rope_kernel",), rope_cases, lambda x, cos, sin: ref.rope(x, cos, sin),
         writes_out=True, hint=rope_hint, dtypes=ALL_DTYPES),
]}
