"""Graded task of week 40, day 1: `layout_index`, the offsets of a CuTe layout in its 1-D (colexicographic) order.

The reference is layout.py's Layout. A failure is diagnosed by computing what each known slip (row-major order,
nested modes walked backwards, strides paired with the wrong modes, nested modes taken whole, the index never
divided) makes of the case's own layout: offsets are integers, so a slip matches only when it gives the same ones.
"""
import itertools
import math

import numpy as np

from ..grading import Case, Task, diagnose, exact
from .layout import Layout, col_major, flatten, row_major, unflatten

EXACT = 1e-9

ROW_MAJOR = ("the last mode varies fastest here (row-major order): CuTe's 1-D index is colexicographic, the FIRST "
             "mode varies fastest, i = c0 + s0·(c1 + s1·(c2 + …)), and inside a nested mode its first mode too")
NESTED_ORDER = ("the modes inside a nested mode are walked last-fastest: colexicographic order holds at every level, "
                "so in (4,(2,2)) the 1-D index runs through the 4, then the first 2, then the second 2 (flatten the "
                "nesting depth first, in order)")
STRIDES_SWAPPED = ("a mode's coordinate is multiplied by another mode's stride: flatten shape and stride the same "
                   "way and pair each extent with its own stride")
TOP_LEVEL_ONLY = ("a nested mode was used as one mode of its whole size with its first stride: split its coordinate "
                  "over its own modes, colexicographically, each times its own stride ((2,2):(1,8) maps 0, 1, 2, 3 "
                  "to 0, 1, 8, 9)")
NOT_DIVIDED = ("every mode took its coordinate from the whole index: after mode k, go on with index // s_k, so the "
               "coordinate of mode k is (i // (s0·…·s_(k-1))) % s_k")


def layout_offsets(shape, stride):
    """(offsets,): L(i) for i = 0 … size − 1 (the reference)."""
    return (Layout(shape, stride).offsets(),)


def _walk(modes) -> np.ndarray:
    """Offsets of flat (extent, stride) modes walked colexicographically in the order given (first fastest)."""
    index = np.arange(math.prod(e for e, _ in modes))
    total = np.zeros(index.size)
    for extent, stride in modes:
        total += (index % extent) * stride
        index = index // extent
    return total


def _top_modes(shape, stride) -> list:
    """[(flat extents, flat strides)] of each top-level mode."""
    if isinstance(shape, int):
        return [((shape,), (stride,))]
    return [(flatten(s), flatten(d)) for s, d in zip(shape, stride)]


def _permuted_strides(extents, strides) -> list:
    """The flat strides given to other modes: every reordering (a few where there are many modes)."""
    n = len(strides)
    if n <= 5:
        orders = itertools.permutations(range(n))
    else:
        orders = [tuple(reversed(range(n)))] + [tuple(range(i)) + (i + 1, i) + tuple(range(i + 2, n))
                                                for i in range(n - 1)]
    return [_walk(list(zip(extents, [strides[j] for j in order]))) for order in orders if list(order) != sorted(order)]


def layout_variants(shape, stride) -> dict:
    """hint -> [offsets] that each known slip makes of the layout shape:stride."""
    extents, strides = flatten(shape), flatten(stride)
    flat = list(zip(extents, strides))
    tops = _top_modes(shape, stride)
    index = np.arange(math.prod(extents))
    return {
        ROW_MAJOR: [_walk(flat[::-1]), _walk([m for e, d in tops[::-1] for m in zip(e, d)])],
        NESTED_ORDER: [_walk([m for e, d in tops for m in list(zip(e, d))[::-1]])],
        STRIDES_SWAPPED: _permuted_strides(extents, strides),
        TOP_LEVEL_ONLY: [_walk([(math.prod(e), d[0]) for e, d in tops])],
        NOT_DIVIDED: [sum((index % e) * d for e, d in flat).astype(np.float64)],
    }


def layout_hint(case, got, expected):
    return diagnose(got, expected, layout_variants(**case.kwargs), rtol=EXACT)


# ---- cases ----------------------------------------------------------------------------------------------------------
CLASSICS = (
    ((4, (2, 2)), (2, (1, 8)), "the example of CuTe's documentation"),
    ((2, (3, 4)), (12, (4, 1)), "row-major (2,(3,4)): the last mode fastest, nested"),
    ((3, 5), (1, 3), "column-major (3,5)"),
    ((4, 3), (0, 1), "mode 0 broadcast (stride 0)"),
    ((1, 1), (3, 7), "size 1"),
    (8, 2, "a single mode: shape and stride are ints"),
)
KINDS = ("column-major", "row-major", "strided, with gaps", "a broadcast mode (stride 0)", "random strides")
MAX_SIZE = 2048


def _random_shape(rng):
    """Ranks 1-3, each mode an extent or a nested mode of 2-3 extents (nesting depth up to 2)."""
    def mode(nested):
        if nested:
            return tuple(int(e) for e in rng.integers(2, 6, int(rng.integers(2, 4))))
        return int(rng.integers(1, 9))
    rank = int(rng.integers(1, 4))
    if rank == 1 and rng.random() < 0.5:
        return mode(False) + 1
    return tuple(mode(rng.random() < 0.5) for _ in range(rank))


def _random_stride(rng, shape, kind):
    if kind == "column-major":
        return col_major(shape).stride
    if kind == "row-major":
        return row_major(shape).stride
    extents = flatten(shape)
    steps = [int(x) for x in rng.integers(0, 40, len(extents))]
    steps[int(rng.integers(0, len(extents)))] = 1
    if kind == "strided, with gaps":  # modes in a random order, each stride past the span of the ones below it
        step = int(rng.integers(1, 4))
        for i in rng.permutation(len(extents)):
            steps[i], step = step, step * extents[i] + int(rng.integers(0, 5))
    if kind == "a broadcast mode (stride 0)":
        steps[int(rng.integers(0, len(extents)))] = 0
    return unflatten(steps, shape)


def layout_cases(rng, dtypes):
    """The classics, then fresh random layouts of every kind (at most MAX_SIZE elements each)."""
    drawn = []
    for i in range(12):
        shape = _random_shape(rng)
        while math.prod(flatten(shape)) > MAX_SIZE:
            shape = _random_shape(rng)
        kind = KINDS[i % len(KINDS)]
        drawn.append((shape, _random_stride(rng, shape, kind), kind))
    return [Case(f"{Layout(shape, stride)}, {what}", (), "float64", kwargs={"shape": shape, "stride": stride})
            for shape, stride, what in CLASSICS + tuple(drawn)]


CUTE_TASKS = [
    Task("w40.layout_index", "numpy", ("layout_index",), layout_cases, exact(layout_offsets), outputs=("offsets",),
         hint=layout_hint, dtypes=("float64",)),
]
