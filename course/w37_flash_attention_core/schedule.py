"""The tile schedule of the FlashAttention forward: which (query block, key block) tiles each program computes,
drawn from the kernel's own block sizes. Owns: `tile_schedule` (the table) and `plot_schedule` (the picture).
The bounds are reference.causal_tile_bounds, the ones the Triton kernel uses."""
import math

import numpy as np

from .reference import causal_tile_bounds

SKIPPED, UNMASKED, MASKED = 0, 1, 2


def tile_schedule(m: int, n: int, block_m: int, block_n: int, causal: bool = False) -> np.ndarray:
    """(query blocks, key blocks) array: SKIPPED (never loaded), UNMASKED (whole keys, no compare) or MASKED
    (the diagonal, or the partial last key block). Row p is what program p does, left to right."""
    rows, cols = math.ceil(m / block_m), math.ceil(n / block_n)
    table = np.full((rows, cols), SKIPPED)
    for p in range(rows):
        free, stop = causal_tile_bounds(p, block_m, block_n, n) if causal else (n // block_n * block_n, n)
        table[p, :free // block_n] = UNMASKED
        table[p, free // block_n:math.ceil(stop / block_n)] = MASKED
    return table


def plot_schedule(m: int, n: int, block_m: int, block_n: int, causal: bool = False, ax=None):
    """The schedule as a grid of tiles: one row per program (query block), one column per key block."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.ticker import MaxNLocator
    table = tile_schedule(m, n, block_m, block_n, causal)
    if ax is None:
        _, ax = plt.subplots(figsize=(min(8, 1 + 0.35 * table.shape[1]), min(6, 1 + 0.35 * table.shape[0])))
    ax.imshow(table, cmap=ListedColormap(["#eeeeee", "#4c72b0", "#dd8452"]), vmin=0, vmax=2, aspect="auto")
    ax.set_xticks(np.arange(table.shape[1] + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(table.shape[0] + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=1)
    ax.tick_params(which="minor", length=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole block numbers only
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(f"key block (BLOCK_N = {block_n})")
    ax.set_ylabel(f"program = query block (BLOCK_M = {block_m})")
    counts = {name: int((table == code).sum()) for name, code in (("unmasked", UNMASKED), ("masked", MASKED),
                                                                   ("skipped", SKIPPED))}
    ax.set_title(f"M = {m}, N = {n}{', causal' if causal else ''}: " + ", ".join(f"{v} {k}" for k, v in counts.items()),
                 fontsize=9)
    return ax
