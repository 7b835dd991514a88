"""Roofline plots: achieved FLOP/s against arithmetic intensity under a machine's two ceilings.

`plot(points, bandwidth_gbps, peak_tflops, title)` draws one; a point is (label, flops, bytes, ms), coloured by the
kernel its label names (course/palette.py).
The FLOPs and bytes come from a week's cost model, the ceilings from course.bench.
"""
import numpy as np

from .palette import colour


def _num(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.3g}"


def plot(points, bandwidth_gbps: float, peak_tflops: float, title: str, ax=None):
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    intensities = [p[1] / p[2] for p in points]
    lo, hi = min(intensities + [0.05]) / 2, max(intensities + [2 * peak_tflops * 1e3 / bandwidth_gbps]) * 2
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.loglog(x, np.minimum(x * bandwidth_gbps / 1e3, peak_tflops), "k-", lw=2)
    ridge = peak_tflops * 1e3 / bandwidth_gbps
    ax.annotate(f"memory roof {_num(bandwidth_gbps)} GB/s", (lo * 1.3, lo * 1.3 * bandwidth_gbps / 1e3 * 2.2),
                fontsize=8, rotation=22)
    ax.annotate(f"compute roof {_num(peak_tflops)} TFLOP/s\n(ridge at {_num(ridge)} FLOP/B)", (ridge / 8, peak_tflops * 1.3),
                fontsize=8)
    for label, flops, nbytes, ms in points:
        ax.plot(flops / nbytes, flops / ms / 1e9, "o", color=colour(label),
                label=f"{label}: {_num(nbytes / ms / 1e6)} GB/s")
    ax.set_ylim(top=peak_tflops * 4)
    ax.set_xlabel("arithmetic intensity (FLOP / byte of memory traffic)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.2)
    return ax
