"""Graded tasks of week 36. The counting exercises are checked, exactly, against course/attention_cost.py
on shapes where the terms they could confuse differ (M != N, d != N, causal with M != N, bh > 1). The
kernel exercise is swept over week 35's adversarial shapes (N = 1, odd lengths, ±1e4 logits, strides).

Hints are diagnoses, as in week 33 (whose `matches` this module shares): each known mistake is applied to the
failing case's own arguments, and the hint names the mistake whose answer the learner's equals (exactly, for the
integer counts); a case where the mistake gives the right answer, or where two mistakes agree, names none.
"""
import math

import numpy as np

from .. import attention_cost as cost
from ..grading import OR, Case, Task, diagnose, exact, seen
from ..grading import matching_bugs as matches
from ..w35_attention_blocks import reference as ref35
from ..w35_attention_blocks.tasks import ALL_DTYPES, HUGE, SDPA, SHAPES, SOFTMAXES

# (bh, m, n, d, element_size): 1 head; M != N; the benchmark's size; fp32; odd everything
COUNT_SHAPES = [(1, 1, 1, 1, 2), (1, 2, 3, 4, 2), (64, 4096, 4096, 128, 2), (3, 100, 37, 64, 4), (16, 511, 1025, 80, 2)]
EXACT = 1e-9  # integer answers: a known mistake matches only when it gives the same integer


def _count_cases(with_causal=False):
    def cases(rng, dtypes):
        out = []
        for bh, m, n, d, size in COUNT_SHAPES:
            for causal in ((False, True) if with_causal else (False,)):
                kwargs = {"bh": bh, "m": m, "n": n, "d": d, "element_size": size}
                if with_causal:
                    kwargs["causal"] = causal
                out.append(Case(f"bh={bh}, M={m}, N={n}, d={d}, {size}-byte elements" + (", causal" if causal else ""),
                                (), "float64", kwargs=kwargs))
        return out
    return cases


def count_hint(variants, rtol=EXACT):
    """A hint from `variants(**case.kwargs)`: output name -> {hint: what a known mistake gives}."""
    def hint(case, got, expected):
        return diagnose(got, expected, variants(**case.kwargs).get(case.output, {}), rtol)
    return hint


# ---------------------------------------------------------------- FLOPs and bytes of one GEMM (qk_cost, pv_cost)
FLOPS_ONE = "half the FLOPs: a multiply-add is two FLOPs, so a (M, d) × (d, N) product is 2·M·N·d per head."
FLOPS_FOUR = "twice the FLOPs: each of the M·N·d multiply-adds is 2 FLOPs, not 4 (count each product once)."
FLOPS_HEAD = "the FLOPs of one head: every one of the bh heads does its own 2·M·N·d."
FLOPS_NO_D = "the head dimension is missing: each of the M·N outputs is a dot product of length d, 2·d FLOPs."
BYTES_ELEMENTS = "counted in elements, not bytes: multiply every tensor's elements by element_size."
BYTES_HEAD = "the bytes of one head: every one of the bh heads reads and writes its own tensors."
QK_NO_S = "the write of S is missing: S = Q Kᵀ is (M, N), written once."
QK_NO_READS = "the reads of Q (M, d) and K (N, d) are missing: a stage's bytes are what it reads plus what it writes."
QK_K_AS_M = "K is counted with M rows: K is (N, d), Q is (M, d), S is (M, N)."
QK_Q_AS_N = "Q is counted with N rows: Q is (M, d), K is (N, d), S is (M, N)."
SCORES_FLOAT32 = "the scores are counted at 4 bytes: here S and P are stored in the inputs' dtype, element_size bytes."
SQUARE = "S and P are (M, N): M queries by N keys, not a square of one of the two lengths."
PV_NO_P = "the read of P is missing: O = P V reads P (M, N) and V (N, d), and writes O (M, d)."
PV_NO_O = "the write of O is missing: O = P V writes O (M, d) once."
PV_V_AS_M = "V is counted as (M, d): V has one row per key, (N, d); O is (M, d)."
PV_O_AS_N = "O is counted as (N, d): O has one row per query, (M, d); V is (N, d)."


def _flops_variants(bh, m, n, d):
    return {FLOPS_ONE: bh * m * n * d, FLOPS_FOUR: 4 * bh * m * n * d, FLOPS_HEAD: 2 * m * n * d,
            FLOPS_NO_D: 2 * bh * m * n}


def _gemm_bytes(bh, size, a, b, c):
    """The common mistakes on a stage that moves tensors of a, b and c elements: in elements, for one head."""
    return {BYTES_ELEMENTS: bh * (a + b + c), BYTES_HEAD: (a + b + c) * size}


def qk_bytes_variants(bh, m, n, d, size):
    q, k, s = m * d, n * d, m * n
    return {**_gemm_bytes(bh, size, q, k, s), QK_NO_S: bh * (q + k) * size, QK_NO_READS: bh * s * size,
            QK_K_AS_M: bh * (2 * q + s) * size, QK_Q_AS_N: bh * (2 * k + s) * size,
            SCORES_FLOAT32: bh * ((q + k) * size + 4 * s),
            SQUARE: [bh * (q + k + m * m) * size, bh * (q + k + n * n) * size]}


def pv_bytes_variants(bh, m, n, d, size):
    p, v, o = m * n, n * d, m * d
    return {**_gemm_bytes(bh, size, p, v, o), PV_NO_P: bh * (v + o) * size, PV_NO_O: bh * (p + v) * size,
            PV_V_AS_M: bh * (p + 2 * o) * size, PV_O_AS_N: bh * (p + 2 * v) * size,
            SCORES_FLOAT32: bh * (4 * p + (v + o) * size),
            SQUARE: [bh * (m * m + v + o) * size, bh * (n * n + v + o) * size]}


def qk_variants(bh, m, n, d, element_size, **_):
    return {"flops": _flops_variants(bh, m, n, d), "bytes": qk_bytes_variants(bh, m, n, d, element_size)}


def pv_variants(bh, m, n, d, element_size, **_):
    return {"flops": _flops_variants(bh, m, n, d), "bytes": pv_bytes_variants(bh, m, n, d, element_size)}


# ---------------------------------------------------------------- the three kernels' bytes (pipeline_bytes)
CAUSAL_HALF = ("a causal mask keeps N(N+1)/2 scores, not N²/2: query i keeps keys 0 … i, its own key (the diagonal) "
               "included; with M ≠ N, Σ_i min(i + 1, N) = k(k+1)/2 + (M - k)·N with k = min(M, N).")
CAUSAL_NO_DIAG = ("the diagonal is dropped: query i keeps keys 0 … i, key i included, so a causal mask keeps "
                  "N(N+1)/2 scores, not N(N-1)/2.")
CAUSAL_FULL = ("the causal softmax reads only the scores its mask keeps: N(N+1)/2 of them (with M ≠ N, "
               "k(k+1)/2 + (M - k)·N, k = min(M, N)), not all M·N; it still writes every probability.")
CAUSAL_ONE_LENGTH = ("with M ≠ N, query i keeps min(i + 1, N) keys: Σ_i min(i + 1, N) = k(k+1)/2 + (M - k)·N with "
                     "k = min(M, N), not a triangle of one of the two lengths.")
CAUSAL_BOTTOM_RIGHT = ("the mask here is top-left: query i keeps keys j <= i, not j <= i + N - M (the bottom-right "
                       "alignment of a decoder's last queries).")
SOFTMAX_NO_WRITE = "the probabilities' write is missing: the softmax writes P, all M·N of it."
SOFTMAX_WRITES_KEPT = ("the softmax writes every probability, M·N of them, the masked zeros included (P is a dense "
                       "(M, N) tensor); it reads only the kept scores.")
SOFTMAX_TWO_READS = ("the fused softmax reads each kept score once: it holds the row while it takes the max and the "
                     "sum, then writes P.")
QK_SKIPS_MASK = "the QKᵀ GEMM does not skip masked scores: a GEMM library computes and writes all M·N of S."
PV_SKIPS_MASK = "the PV GEMM reads all of P: a GEMM library multiplies the masked zeros too (M·N reads)."


def _triangle(m, n, diagonal=True):
    k = min(m, n)
    return (k * (k + 1) // 2 if diagonal else k * (k - 1) // 2) + (m - k) * n


def pipeline_variants(bh, m, n, d, element_size, causal=False):
    size = element_size
    kept = cost.kept_keys(m, n, causal)
    out = {"qk": qk_bytes_variants(bh, m, n, d, size),
           "pv": pv_bytes_variants(bh, m, n, d, size)}
    soft = {BYTES_ELEMENTS: bh * (kept + m * n), BYTES_HEAD: (kept + m * n) * size,
            SOFTMAX_NO_WRITE: bh * kept * size, SOFTMAX_WRITES_KEPT: 2 * bh * kept * size,
            SOFTMAX_TWO_READS: bh * (2 * kept + m * n) * size}
    if causal:
        def softmax(read):
            return bh * (read + m * n) * size
        bottom_right = sum(min(max(i + 1 + n - m, 0), n) for i in range(m))
        soft.update({CAUSAL_HALF: [softmax(m * n / 2), softmax(m * n // 2), softmax(n * n / 2), softmax(m * m / 2)],
                     CAUSAL_NO_DIAG: softmax(_triangle(m, n, diagonal=False)),
                     CAUSAL_FULL: softmax(m * n),
                     CAUSAL_ONE_LENGTH: [softmax(n * (n + 1) // 2), softmax(m * (m + 1) // 2)],
                     CAUSAL_BOTTOM_RIGHT: softmax(bottom_right)})
        out["qk"][QK_SKIPS_MASK] = bh * ((m + n) * d + kept) * size
        out["pv"][PV_SKIPS_MASK] = bh * (kept + (n + m) * d) * size
    out["softmax"] = soft
    return out


# ---------------------------------------------------------------- which roof (roofline_bound)
def roofline_cases(rng, dtypes):
    out = []
    # (flops, bytes) of a softmax, a QKᵀ and a big GEMM, on an H200-like and on a made-up machine
    for flops, nbytes in ((5.4e9, 4.3e9), (2.7e11, 2.2e9), (1.1e12, 4.0e8), (1.0, 1.0)):
        for bw, peak in ((4274.5, 686.2), (1000.0, 100.0)):
            out.append(Case(f"{flops:.3g} FLOPs, {nbytes:.3g} bytes, {bw:g} GB/s, {peak:g} TFLOP/s", (), "float64",
                            kwargs={"flops": flops, "nbytes": nbytes, "bandwidth_gbps": bw, "peak_tflops": peak}))
    return out


def _roofline(flops, nbytes, bandwidth_gbps, peak_tflops):
    intensity = cost.arithmetic_intensity({"flops": flops, "bytes": nbytes})
    ridge = peak_tflops * 1e3 / bandwidth_gbps
    ms = max(nbytes / bandwidth_gbps / 1e6, flops / peak_tflops / 1e9)
    return intensity, ridge, ms, float(intensity > ridge)


INTENSITY_INVERTED = "the intensity is FLOPs per byte moved (flops / nbytes), not bytes per FLOP."
RIDGE_UNITS = ("the ridge needs the units converted first: TFLOP/s is 1e12 FLOP/s and GB/s is 1e9 B/s, so the ridge "
               "is peak·1e12 / (bandwidth·1e9) FLOP/B.")
RIDGE_INVERTED = "the ridge is peak / bandwidth (FLOP/s over B/s, in FLOP/B), not bandwidth / peak."
MS_SUM = ("the least time is the larger of the two lower bounds (bytes at the bandwidth, FLOPs at the peak), not "
          "their sum: memory and compute overlap.")
MS_MIN = ("this is the faster roof's time: the least time is the larger of the two lower bounds (bytes / bandwidth "
          "and FLOPs / peak), so the slower roof bounds the stage; are both computed and the larger one kept?")
MS_SECONDS = "the time is asked in ms: the bounds come out in seconds, multiply by 1e3."
MS_MICRO = "the time is asked in ms: 1 s is 1e3 ms (these bounds came out in µs)."
ROOFS_SWAPPED = ("the roofs are swapped: a stage whose intensity is above the ridge is bound by the compute roof "
                 "(1.0), below it by memory (0.0).")


def roofline_variants(flops, nbytes, bandwidth_gbps, peak_tflops):
    t_mem, t_flop = nbytes / (bandwidth_gbps * 1e9), flops / (peak_tflops * 1e12)
    intensity, ridge, ms, bound = _roofline(flops, nbytes, bandwidth_gbps, peak_tflops)
    return {"intensity": {INTENSITY_INVERTED: nbytes / flops},
            "ridge": {RIDGE_UNITS: peak_tflops / bandwidth_gbps,
                      RIDGE_INVERTED: bandwidth_gbps * 1e9 / (peak_tflops * 1e12)},
            "ms": {MS_SUM: (t_mem + t_flop) * 1e3, MS_MIN: min(t_mem, t_flop) * 1e3, MS_SECONDS: ms / 1e3,
                   MS_MICRO: ms * 1e3},
            "compute_bound": {ROOFS_SWAPPED: 1.0 - bound}}


# ---------------------------------------------------------------- where it stops fitting (largest_n)
def largest_n_cases(rng, dtypes):
    out = []
    for memory, bh, d, size, square in ((80e9, 64, 128, 2, 4), (141e9, 64, 128, 2, 2), (24e9, 16, 64, 2, 4),
                                        (1e6, 1, 8, 4, 8), (46_400, 1, 8, 2, 4), (46_399, 1, 8, 2, 4), (100, 1, 64, 2, 4)):
        out.append(Case(f"{memory:.3g} bytes, bh={bh}, d={d}, {size}-byte elements, {square} bytes per pair", (),
                        "float64", kwargs={"memory_bytes": memory, "bh": bh, "d": d, "element_size": size,
                                           "square_bytes": square}))
    return out


def _fits(memory, a, b, strict=False) -> int:
    """The largest N >= 0 with a·N² + b·N <= memory (< memory when strict), counted exactly."""
    n = int((-b + math.sqrt(b * b + 4 * a * memory)) / (2 * a)) if a else int(memory // b)
    while (a * (n + 1) ** 2 + b * (n + 1) < memory) if strict else (a * (n + 1) ** 2 + b * (n + 1) <= memory):
        n += 1
    while n > 0 and ((a * n * n + b * n >= memory) if strict else (a * n * n + b * n > memory)):
        n -= 1
    return n


PEAK_NO_QKVO = "too large: the peak holds Q, K, V and O (4·bh·N·d elements, element_size bytes each) besides the pairs."
PEAK_QKVO_ELEMENTS = "Q, K, V and O are counted in elements: each of their 4·bh·N·d elements takes element_size bytes."
PEAK_THREE = "O is alive at the peak too: four (N, d) tensors per head, Q, K, V and O, not three."
PEAK_PAIRS_ELEMENT_SIZE = ("each (query, key) pair takes square_bytes (S and P alive at once), not element_size: "
                           "the pairs cost bh·N²·square_bytes.")
PEAK_NO_BH = "every one of the bh heads holds its own N² pairs and its own Q, K, V and O: multiply both terms by bh."
ONE_TOO_MANY = ("one too many: N must satisfy peak(N) <= memory. Round the root down, then check N + 1 with exact "
                "integers.")
STRICT = "a peak exactly equal to the memory still fits: the test is peak(N) <= memory, not <."


def largest_n_variants(memory_bytes, bh, d, element_size, square_bytes):
    a, b = bh * square_bytes, 4 * bh * d * element_size
    right = _fits(memory_bytes, a, b)
    return {"n": {PEAK_NO_QKVO: _fits(memory_bytes, a, 0), PEAK_QKVO_ELEMENTS: _fits(memory_bytes, a, 4 * bh * d),
                  PEAK_THREE: _fits(memory_bytes, a, 3 * bh * d * element_size),
                  PEAK_PAIRS_ELEMENT_SIZE: _fits(memory_bytes, bh * element_size, b),
                  PEAK_NO_BH: _fits(memory_bytes, square_bytes, 4 * d * element_size),
                  ONE_TOO_MANY: right + 1, STRICT: _fits(memory_bytes, a, b, strict=True)}}


# ---------------------------------------------------------------- the softmax batched over heads (a kernel)
def softmax_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for shape_name, b, h, m, n, d in SHAPES[:4] + [("short rows, B = H = 4 (4, 4, 5, 24): a program's rows span "
                                                        "heads", 4, 4, 5, 24, 16)]:
            for causal in (False, True):
                cases.append(Case(f"{'causal' if causal else 'no mask'}, {shape_name}",
                                  (rng.normal(0, 3, (b, h, m, n)),), dtype,
                                  kwargs={"scale": 1 / np.sqrt(d), "causal": causal}))
        cases.append(Case(f"huge logits: uniform in ±{HUGE:g}, scale 1/8", (rng.uniform(-HUGE, HUGE, (2, 2, 7, 300)),),
                          dtype, kwargs={"scale": 0.125, "causal": True}))
        cases.append(Case("non-contiguous scores (2, 3, 37, 37), causal", (rng.normal(0, 3, (2, 3, 37, 37)),), dtype,
                          kwargs={"scale": 0.125, "causal": True}, strided=True))
        cases.append(Case("long rows (1, 2, 3, 3000)", (rng.normal(0, 3, (1, 2, 3, 3000)),), dtype,
                          kwargs={"scale": 0.125}))
    return cases


NO_SCALE = "the scale is never applied: the softmax is of scale · scores."
SCALE_DIVIDED = "the scores are divided by the scale: multiply them by it (scale is already 1/√d)."
NO_MAX = "exp overflowed: subtract each row's max (of the scaled, masked scores) before exp."
DIAGONAL_MASKED = "the diagonal is masked: query i may attend to key i itself (keep j <= i)."
NO_CAUSAL = "the causal mask is missing: with causal=True, query i keeps only keys j <= i."
CAUSAL_FLIPPED = "the causal mask is flipped: query i keeps keys j <= i (the past), not j >= i."
QUERY_INDEX = "the query index of row r is r % M (M queries per head), not r % N."
MASK_ZERO = ("masked and padding lanes are set to 0, so they join the max and the sum as logits of 0: set them to "
             "-inf.")
STRIDES_IGNORED = ("the heads are read as if contiguous (row r at r·N): the scores have their own batch, head and "
                   "row strides; read row (b, h, i) at b·stride_b + h·stride_h + i·stride_m.")
HEADS_SWAPPED = ("batch and head are swapped in the row's index: with r = (b·H + h)·M + i, b = r // (H·M) and "
                 "h = (r // M) % H.")
TILE_MAX = ("the rows of one program share a max: take the max along each row (axis=1), not over the whole "
            "[ROWS, BLOCK_N] tile, or rows far below the tile's max underflow to 0.")
NON_FINITE = "NaN or inf where the answer is finite: is each row's max subtracted, and is a zero sum guarded?"


def _row_softmax(x):
    """The kernel's softmax in float32 over the last axis of x (masked entries -inf): a row with no key gives
    zeros, and each row is multiplied by the reciprocal of its sum (1 where the sum is 0)."""
    with np.errstate(all="ignore"):
        top = x.max(axis=-1, keepdims=True)
        e = np.exp(x - np.where(np.isneginf(top), 0.0, top))
        total = e.sum(axis=-1, keepdims=True)
        return (e * (np.float32(1) / np.where(total > 0, total, np.float32(1)))).astype(np.float64)


def _masked(x, keep):
    return np.where(keep, x, -np.inf).astype(np.float32)


def _keep(m, n, causal, query=None, flip=False, diagonal=True):
    i = np.arange(m)[:, None] if query is None else query[:, None]
    j = np.arange(n)[None, :]
    if not causal:
        return np.ones((m, n), bool)
    if flip:
        return j >= i
    return j <= i if diagonal else j < i


def _tile_max(x, block_rows):
    """softmax where each group of `block_rows` consecutive rows (one program) shares the max of the group."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    groups = -(-len(rows) // block_rows)
    padded = np.full((groups * block_rows, n), -np.inf, np.float32)
    padded[:len(rows)] = rows
    with np.errstate(all="ignore"):
        top = padded.reshape(groups, -1).max(axis=-1)
        top = np.repeat(np.where(np.isneginf(top), 0.0, top), block_rows)[:len(rows), None]
        e = np.exp(rows - top)
        total = e.sum(axis=-1, keepdims=True)  # a denormal total: its float32 reciprocal is inf, as the kernel's
        return (e * (np.float32(1) / np.where(total > 0, total, np.float32(1)))).reshape(x.shape).astype(np.float64)


def batched_softmax_variants(s, strided, scale=1.0, causal=False):
    b, h, m, n = s.shape
    keep = _keep(m, n, causal)
    x = s.astype(np.float32) * np.float32(scale)
    block = max(16, 1 << (n - 1).bit_length())  # the launcher's BLOCK_N; lanes past N are padding
    zero_masked = np.concatenate([np.where(keep, x, 0.0), np.zeros((b, h, m, block - n))], axis=-1)
    out = {NO_SCALE: _row_softmax(_masked(s.astype(np.float32), keep)),
           SCALE_DIVIDED: _row_softmax(_masked(s.astype(np.float32) / np.float32(scale), keep)),
           MASK_ZERO: _row_softmax(zero_masked)[..., :n],
           TILE_MAX: _tile_max(_masked(x, keep), max(1, min(16, 2048 // block)))}
    with np.errstate(all="ignore"):
        e = np.exp(_masked(x, keep))
        out[NO_MAX] = (e / e.sum(axis=-1, keepdims=True)).astype(np.float64)
    if causal:
        out[DIAGONAL_MASKED] = _row_softmax(_masked(x, _keep(m, n, True, diagonal=False)))
        out[NO_CAUSAL] = _row_softmax(x)
        out[CAUSAL_FLIPPED] = _row_softmax(_masked(x, _keep(m, n, True, flip=True)))
        if m != n:
            out[QUERY_INDEX] = _row_softmax(_masked(x, _keep(m, n, True, query=np.arange(m) % n)))
    if strided:  # stored as (B, M, H, N): row r of the storage is not row r of the view
        read = s.transpose(0, 2, 1, 3).reshape(b, h, m, n).astype(np.float32) * np.float32(scale)
        out[STRIDES_IGNORED] = _row_softmax(_masked(read, keep))
    if b == h and b > 1:
        out[HEADS_SWAPPED] = _row_softmax(_masked(x.transpose(1, 0, 2, 3), keep))
    return out


def batched_softmax_hint(case, got, expected):
    (s,) = seen(case)
    found = matches(got, expected, batched_softmax_variants(s, case.strided, **case.kwargs))
    if not found and (~np.isfinite(got) & np.isfinite(expected)).any():
        return NON_FINITE
    return OR.join(found[:3]) or None  # bugs this case cannot tell apart share its vote (grading._diagnosis)


# ---------------------------------------------------------------- tasks
def _kw(kw, *names):
    return [kw[k] for k in names]


def _stage(name):
    return lambda **kw: getattr(cost, name)(*_kw(kw, "bh", "m", "n", "d", "element_size")).values()


def _pipeline(**kw):
    stages = cost.standard_attention_cost(*_kw(kw, "bh", "m", "n", "d", "element_size"), causal=kw["causal"])
    return [stages[s]["bytes"] for s in ("qk", "softmax", "pv")]


TASKS = {t.id: t for t in [
    Task("w36.qk_cost", "numpy", ("qk_cost",), _count_cases(), exact(_stage("qk_cost")), outputs=("flops", "bytes"),
         hint=count_hint(qk_variants), dtypes=("float64",)),
    Task("w36.pv_cost", "numpy", ("pv_cost",), _count_cases(), exact(_stage("pv_cost")), outputs=("flops", "bytes"),
         hint=count_hint(pv_variants), dtypes=("float64",)),
    Task("w36.largest_n", "numpy", ("largest_n",), largest_n_cases,
         exact(lambda **kw: [cost.largest_n(**kw)]), outputs=("n",), hint=count_hint(largest_n_variants),
         dtypes=("float64",)),
    Task("w36.roofline_bound", "numpy", ("roofline_bound",), roofline_cases, exact(_roofline),
         outputs=("intensity", "ridge", "ms", "compute_bound"), hint=count_hint(roofline_variants, rtol=1e-6),
         dtypes=("float64",)),
    Task("w36.pipeline_bytes", "numpy", ("pipeline_bytes",), _count_cases(with_causal=True), exact(_pipeline),
         outputs=("qk", "softmax", "pv"), hint=count_hint(pipeline_variants), dtypes=("float64",)),
    Task("w36.batched_softmax", "triton", ("batched_softmax_kernel",), softmax_cases,
         lambda s, scale=1.0, causal=False: ref35.scale_mask_softmax(s, scale, causal=causal),
         outputs=("p",), writes_out=True, banned=SOFTMAXES + SDPA, hint=batched_softmax_hint, dtypes=ALL_DTYPES),
]}
