"""Graded task of week 40, day 5: a kernel's place on the roofline from its FLOPs, bytes and time (the profiler's
first question: which ceiling binds, and how far below it the kernel runs). Slips are diagnosed on the case's own
numbers."""
import numpy as np

from ..grading import Case, Task, diagnose, pick, seen
from . import reference as ref

SECONDS = "ms is milliseconds: the time in seconds is ms·1e-3 (a rate off by 1000 is a unit slip)"
RIDGE = ("the ridge point is the peak rate over the bandwidth, peak_tflops·1e3 / peak_gbps FLOP/byte: a kernel whose "
         "intensity reaches it is compute-bound")
ROOF_MAX = "the roof is the LOWER of the two ceilings: attainable = min(peak, intensity·bandwidth)"
SHARE_OF_PEAK = ("the share is of what the roofline allows at this kernel's intensity (its least time over the measured "
                 "time), not of the compute peak: a memory-bound kernel is judged against the bandwidth")
GB_UNITS = "intensity·bandwidth is in GFLOP/s when the bandwidth is in GB/s: divide by 1e3 for TFLOP/s"


def roofline_variants(flops, nbytes, ms, peak_tflops, peak_gbps):
    """hint -> [(intensity, attainable, achieved, share, bound)] of the known slips (None: right under the slip)."""
    intensity, attainable, achieved, share, bound = ref.roofline_bound(flops, nbytes, ms, peak_tflops, peak_gbps)
    with np.errstate(all="ignore"):
        return {
            SECONDS: [(None, None, achieved * 1e-3, share * 1e-3, None), (None, None, achieved * 1e3, share * 1e3, None)],
            RIDGE: [(None, None, None, None, (intensity >= peak_gbps / (peak_tflops * 1e3)).astype(float)),
                    (None, None, None, None, (intensity >= peak_gbps / peak_tflops).astype(float))],
            ROOF_MAX: [(None, np.maximum(peak_tflops, intensity * peak_gbps * 1e-3), None, None, None)],
            SHARE_OF_PEAK: [(None, None, None, achieved / peak_tflops, None),
                            (None, None, None, achieved / attainable, None)],
            GB_UNITS: [(None, np.minimum(peak_tflops, intensity * peak_gbps), None, None, None)],
        }


def roofline_hint(case, got, expected):
    outputs = ("intensity", "attainable", "achieved", "share", "bound")
    variants = roofline_variants(*seen(case), **case.kwargs)
    return diagnose(got, expected, pick(variants, outputs.index(case.output)))


def roofline_cases(rng, dtypes):
    """Kernels of both kinds on an H100-like and an H200-like roofline and on random ones: matrix products
    (compute-bound), elementwise kernels (memory-bound, some with no FLOPs), attention, a kernel exactly at the ridge."""
    cases = []
    for name, peak, bandwidth in (("H100-like (700 TFLOP/s, 3000 GB/s)", 700.0, 3000.0),
                                  ("H200-like (690 TFLOP/s, 4300 GB/s)", 690.0, 4300.0),
                                  ("a random roofline", float(rng.uniform(50, 1000)), float(rng.uniform(500, 8000)))):
        count = int(rng.integers(4, 12))
        nbytes = 10 ** rng.uniform(6, 10, count)
        flops = nbytes * 10 ** rng.uniform(-1, 3, count)
        flops[0] = 0.0                                          # an elementwise kernel: bytes only
        flops[1] = nbytes[1] * peak * 1e3 / bandwidth           # exactly at the ridge point
        least = np.maximum(flops / (peak * 1e12), nbytes / (bandwidth * 1e9))
        ms = least * 1e3 / rng.uniform(0.3, 0.95, count)        # slower than the roof allows, as measured
        cases.append(Case(f"{count} kernels on {name}", (flops, nbytes, ms), "float64",
                          kwargs={"peak_tflops": peak, "peak_gbps": bandwidth}))
    return cases


ROOFLINE_TASKS = [
    Task("w40.roofline_bound", "numpy", ("roofline_bound",), roofline_cases, ref.roofline_bound,
         outputs=("intensity", "attainable", "achieved", "share", "bound"), hint=roofline_hint, dtypes=("float64",)),
]
