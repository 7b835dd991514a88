"""HBM traffic of attention against the sequence length N and the on-chip memory size M, for week 37's notebooks.
Owns: the on-chip sizes of three GPUs (`SHARED_MEMORY`), the block sizes of a query-outer kernel for a given M
(`query_outer_blocks`), the three curves at one point (`traffic_bytes`) and the two plots. It counts nothing
itself: standard and FlashAttention bytes come from course/attention_cost.py, the paper's block sizes and bound
from reference.py."""
import numpy as np

from .. import attention_cost as cost
from .reference import io_bound, sram_blocks

KB = 1024
# Most shared memory one SM can give its thread blocks (NVIDIA's Volta, Ampere and Hopper tuning guides).
SHARED_MEMORY = {"V100": 96 * KB, "A100": 164 * KB, "H100": 228 * KB}


def query_outer_blocks(sram_bytes: int, d: int, element_size: int = 4):
    """(block_m, block_n) for a kernel whose outer loop runs over query blocks (this course's kernels, as in
    FlashAttention-2). The paper's Algorithm 1 holds ⌈M/4d⌉ keys and streams queries past them, with at most
    min(⌈M/4d⌉, d) queries at a time; with the loops swapped the held block is the query block, so the two
    sizes swap too: the same on-chip budget, the same Θ(N²d²/M)."""
    br, bc = sram_blocks(sram_bytes, d, element_size)
    return bc, br


def traffic_bytes(n: int, d: int, sram_bytes: int, element_size: int = 4, bh: int = 1) -> dict:
    """HBM bytes of self-attention (M = N) for bh heads: standard attention's three kernels, the query-outer
    FlashAttention forward with query_outer_blocks, and the paper's bound N²d²/M (in elements) in bytes."""
    block_m, _ = query_outer_blocks(sram_bytes, d, element_size)
    return {"standard": cost.standard_attention_cost(bh, n, n, d, element_size)["total"]["bytes"],
            "flash": cost.flash_attention_cost(bh, n, n, d, element_size, block_m)["bytes"],
            "bound": bh * io_bound(n, d, sram_bytes, element_size) * element_size}


def _bound_mb(points, ns, d, srams, element_size):
    """The bound in MB where the paper's Theorem 2 states it (M <= Nd), NaN elsewhere (the plots leave a gap)."""
    return [p["bound"] / 1e6 if s <= n * d * element_size else np.nan for p, n, s in zip(points, ns, srams)]


def _axes(ax):
    import matplotlib.pyplot as plt
    return plt.subplots(figsize=(6.4, 4.2))[1] if ax is None else ax


def _finish(ax, xlabel: str, shape: str, element_size: int, bh: int):
    ax.set_xlabel(xlabel)
    ax.set_ylabel("HBM traffic (MB)")
    ax.set_title(f"{shape}, {element_size}-byte elements, {bh} head{'s' * (bh > 1)}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.2)
    return ax


def plot_traffic_vs_n(ns, d: int, srams: dict, element_size: int = 4, bh: int = 1, ax=None):
    """Traffic (MB) against N on log-log axes: standard attention, and for each {label: bytes} in srams the
    FlashAttention forward (solid) and the paper's bound N²d²/M (dotted, same colour)."""
    ax, ns = _axes(ax), np.asarray(ns)
    standard = [cost.standard_attention_cost(bh, n, n, d, element_size)["total"]["bytes"] / 1e6 for n in ns]
    ax.loglog(ns, standard, "k-", lw=2, label="standard (S and P through HBM)")
    for i, (label, sram) in enumerate(srams.items()):
        points = [traffic_bytes(n, d, sram, element_size, bh) for n in ns]
        block_m, block_n = query_outer_blocks(sram, d, element_size)
        ax.loglog(ns, [p["flash"] / 1e6 for p in points], "-", color=f"C{i}",
                  label=f"flash, {label} ({sram // KB} KB: {block_m} × {block_n} blocks)")
        ax.loglog(ns, _bound_mb(points, ns, d, [sram] * len(ns), element_size), ":", color=f"C{i}")
    ax.plot([], [], "k:", label="the paper's $N^2d^2/M$ (dotted, for $M \\leq Nd$)")
    return _finish(ax, "N (queries = keys)", f"self-attention, d = {d}", element_size, bh)


def plot_traffic_vs_sram(n: int, d: int, srams, element_size: int = 4, bh: int = 1, marks=None, ax=None):
    """Traffic (MB) against the on-chip memory M (KB) at fixed N and d: the FlashAttention forward, the bound
    N²d²/M, standard attention (flat: it does not use M), and a vertical line at each {label: bytes} in marks."""
    ax, srams = _axes(ax), np.asarray(srams)
    points = [traffic_bytes(n, d, int(s), element_size, bh) for s in srams]
    ax.loglog(srams / KB, [p["standard"] / 1e6 for p in points], "k-", lw=2, label="standard")
    ax.loglog(srams / KB, [p["flash"] / 1e6 for p in points], "C0-", label="flash (query-outer blocks)")
    ax.loglog(srams / KB, _bound_mb(points, [n] * len(srams), d, srams, element_size), "C0:",
              label="the paper's $N^2d^2/M$ (for $M \\leq Nd$)")
    for i, (label, sram) in enumerate((marks or {}).items()):
        ax.axvline(sram / KB, color=f"C{i + 1}", lw=1, ls="--", label=f"{label}: {sram // KB} KB")
    return _finish(ax, "on-chip memory M (KB)", f"N = {n}, d = {d}", element_size, bh)
