"""Graded tasks of week 36. The counting exercises are checked, exactly, against course/attention_cost.py
on shapes where the terms they could confuse differ (M != N, d != N, causal with M != N, bh > 1). The
kernel exercise is swept over week 35's adversarial shapes (N = 1, odd lengths, ±1e4 logits, strides)."""
import numpy as np

from .. import attention_cost as cost
from ..grading import Case, Task, exact
from ..w35_attention_blocks import reference as ref35
from ..w35_attention_blocks.tasks import ALL_DTYPES, HUGE, SDPA, SHAPES, SOFTMAXES, softmax_hint

# (bh, m, n, d, element_size): 1 head; M != N; the benchmark's size; fp32; odd everything
COUNT_SHAPES = [(1, 1, 1, 1, 2), (1, 2, 3, 4, 2), (64, 4096, 4096, 128, 2), (3, 100, 37, 64, 4), (16, 511, 1025, 80, 2)]


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


def count_hint(case, got, expected):
    ratio = got / np.where(expected == 0, 1, expected)
    if np.allclose(ratio, 0.5):
        return "half the answer: a multiply-add is two FLOPs, and every tensor counts in bytes (elements × size)."
    if np.allclose(ratio, 2.0):
        return "twice the answer: is something counted twice, or a multiply-add counted as four FLOPs?"
    if case.kwargs.get("m") != case.kwargs.get("n"):
        return "right when M = N only? Q is (M, d), K and V are (N, d), S and P are (M, N)."
    return "count each tensor a stage reads or writes once: its elements × bh × element_size."


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


def roofline_hint(case, got, expected):
    intensity, ridge, ms, bound = _roofline(**case.kwargs)
    e = float(expected)
    if np.isclose(e, ridge):
        return "the ridge is peak / bandwidth in FLOP/B: convert TFLOP/s (1e12) and GB/s (1e9) first."
    if np.isclose(e, ms):
        return "the least time is the larger of the two lower bounds (bytes at the bandwidth, FLOPs at the peak), in ms."
    if np.isclose(e, intensity):
        return "the intensity is FLOPs per byte moved."
    return "a stage whose intensity is above the ridge is bound by the compute roof (1.0), below it by memory (0.0)."


def largest_n_cases(rng, dtypes):
    out = []
    for memory, bh, d, size, square in ((80e9, 64, 128, 2, 4), (141e9, 64, 128, 2, 2), (24e9, 16, 64, 2, 4),
                                        (1e6, 1, 8, 4, 8), (46_400, 1, 8, 2, 4), (46_399, 1, 8, 2, 4), (100, 1, 64, 2, 4)):
        out.append(Case(f"{memory:.3g} bytes, bh={bh}, d={d}, {size}-byte elements, {square} bytes per pair", (),
                        "float64", kwargs={"memory_bytes": memory, "bh": bh, "d": d, "element_size": size,
                                           "square_bytes": square}))
    return out


def largest_n_hint(case, got, expected):
    if got == expected + 1:
        return "one too many: N must satisfy peak(N) <= memory; round down, and check the boundary."
    if got > expected:
        return "too large: the peak holds Q, K, V and O (4·bh·N·d elements) besides the bh·N² pairs."
    return "too small: is each pair counted with square_bytes, and each of Q, K, V, O with element_size?"


def softmax_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for shape_name, b, h, m, n, d in SHAPES[:4] + [("short rows, many heads (4, 8, 5, 24)", 4, 8, 5, 24, 16)]:
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


def _kw(kw, *names):
    return [kw[k] for k in names]


def _stage(name):
    return lambda **kw: getattr(cost, name)(*_kw(kw, "bh", "m", "n", "d", "element_size")).values()


def _pipeline(**kw):
    stages = cost.standard_attention_cost(*_kw(kw, "bh", "m", "n", "d", "element_size"), causal=kw["causal"])
    return [stages[s]["bytes"] for s in ("qk", "softmax", "pv")]


COUNTING = dict(dtypes=("float64",), hint=count_hint)
TASKS = {t.id: t for t in [
    Task("w36.qk_cost", "numpy", ("qk_cost",), _count_cases(), exact(_stage("qk_cost")), outputs=("flops", "bytes"),
         **COUNTING),
    Task("w36.pv_cost", "numpy", ("pv_cost",), _count_cases(), exact(_stage("pv_cost")), outputs=("flops", "bytes"),
         **COUNTING),
    Task("w36.largest_n", "numpy", ("largest_n",), largest_n_cases,
         exact(lambda **kw: [cost.largest_n(**kw)]), outputs=("n",), hint=largest_n_hint, dtypes=("float64",)),
    Task("w36.roofline_bound", "numpy", ("roofline_bound",), roofline_cases, exact(_roofline),
         outputs=("intensity", "ridge", "ms", "compute_bound"), hint=roofline_hint, dtypes=("float64",)),
    Task("w36.pipeline_bytes", "numpy", ("pipeline_bytes",), _count_cases(with_causal=True), exact(_pipeline),
         outputs=("qk", "softmax", "pv"), **COUNTING),
    Task("w36.batched_softmax", "triton", ("batched_softmax_kernel",), softmax_cases,
         lambda s, scale=1.0, causal=False: ref35.scale_mask_softmax(s, scale, causal=causal),
         outputs=("p",), writes_out=True, banned=SOFTMAXES + SDPA, hint=softmax_hint, dtypes=ALL_DTYPES),
]}
