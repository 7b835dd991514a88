"""CuTe's layout algebra in plain Python: the reference week 40's lessons draw and its grader trusts.

A layout is a shape and a stride, congruent nested tuples of ints. It maps a coordinate to an offset: the natural
coordinate (one int per innermost mode) dotted with the stride. A 1-D index becomes a coordinate colexicographically,
the FIRST mode varying fastest, at every level of nesting, as in CuTe. The algebra (coalesce, composition, complement,
the divides, right_inverse) follows NVIDIA's CuTe documentation ("CuTe Layouts", "CuTe Layout Algebra"); strides are
non-negative here. The code is ours: it works on the flattened list of (extent, stride) modes.
"""
import math
from dataclasses import dataclass

import numpy as np


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _tidy(t):
    """Python ints in nested tuples (lists and NumPy ints accepted)."""
    if _is_int(t):
        return int(t)
    if isinstance(t, (tuple, list)) and len(t) > 0:
        return tuple(_tidy(x) for x in t)
    raise ValueError(f"a shape or stride is an int or a non-empty tuple of them, not {t!r}")


def flatten(t) -> tuple:
    """The ints of a nested tuple, depth first: (4, (2, 2)) -> (4, 2, 2)."""
    return (t,) if _is_int(t) else tuple(x for mode in t for x in flatten(mode))


def unflatten(flat, profile):
    """`flat` ints put back into the nesting of `profile`: unflatten((4, 1, 8), (4, (2, 2))) -> (4, (1, 8))."""
    flat = list(flat)

    def take(p):
        return flat.pop(0) if _is_int(p) else tuple(take(m) for m in p)
    return take(profile)


def congruent(a, b) -> bool:
    if _is_int(a) or _is_int(b):
        return _is_int(a) and _is_int(b)
    return len(a) == len(b) and all(congruent(x, y) for x, y in zip(a, b))


def _text(t) -> str:
    return str(t) if _is_int(t) else "(" + ",".join(_text(x) for x in t) + ")"


def _depth(t) -> int:
    return 0 if _is_int(t) else 1 + max(_depth(m) for m in t)


# ---- coordinates ------------------------------------------------------------------------------------------------
def idx2crd(index, shape):
    """The natural coordinate of a 1-D index (or of a coordinate with ints where `shape` has nested modes),
    colexicographic: the first mode varies fastest. As in CuTe, the last mode takes the whole quotient, so an index
    past the end lands on the last mode's extension."""
    if not _is_int(index):
        if _is_int(shape) or len(index) != len(shape):
            raise ValueError(f"coordinate {_text(index)} does not match shape {_text(shape)}")
        return tuple(idx2crd(c, s) for c, s in zip(index, shape))
    if _is_int(shape):
        return int(index)
    coord = []
    for i, mode in enumerate(shape):
        extent = math.prod(flatten(mode))
        coord.append(idx2crd(index if i == len(shape) - 1 else index % extent, mode))
        index //= extent
    return tuple(coord)


def crd2idx(coord, shape, stride) -> int:
    """The offset of a coordinate: a 1-D index, a natural coordinate, or anything between (an int for a nested
    mode is split over that mode colexicographically)."""
    natural = idx2crd(coord, shape)
    return sum(c * d for c, d in zip(flatten(natural), flatten(stride)))


# ---- the layout ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """shape:stride, e.g. Layout((4, (2, 2)), (2, (1, 8))) is CuTe's (4,(2,2)):(2,(1,8)). Without a stride, the
    compact column-major one (CuTe's default, LayoutLeft)."""
    shape: object
    stride: object = None

    def __post_init__(self):
        shape = _tidy(self.shape)
        stride = col_strides(shape) if self.stride is None else _tidy(self.stride)
        if not congruent(shape, stride):
            raise ValueError(f"shape {_text(shape)} and stride {_text(stride)} are not congruent (same nesting)")
        if min(flatten(shape)) < 1 or min(flatten(stride)) < 0:
            raise ValueError(f"extents must be >= 1 and strides >= 0: {_text(shape)}:{_text(stride)}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "stride", stride)

    @property
    def size(self) -> int:
        return math.prod(flatten(self.shape))

    @property
    def cosize(self) -> int:
        """One past the largest offset (strides are non-negative, so the last coordinate reaches it)."""
        return self(self.size - 1) + 1

    @property
    def rank(self) -> int:
        return 1 if _is_int(self.shape) else len(self.shape)

    @property
    def depth(self) -> int:
        return _depth(self.shape)

    def __call__(self, *coord) -> int:
        """L(i), L((i, j)) or L(i, j): the offset of a 1-D index or a (possibly nested) coordinate."""
        return crd2idx(coord[0] if len(coord) == 1 else coord, self.shape, self.stride)

    def mode(self, i: int) -> "Layout":
        return self if _is_int(self.shape) and i == 0 else Layout(self.shape[i], self.stride[i])

    def modes(self) -> list:
        return [self.mode(i) for i in range(self.rank)]

    def flat_modes(self) -> list:
        """[(extent, stride)] of the innermost modes, depth first: the order the 1-D index walks them."""
        return list(zip(flatten(self.shape), flatten(self.stride)))

    def offsets(self) -> np.ndarray:
        """L(i) for every 1-D index i = 0 … size − 1, as int64."""
        index, total = np.arange(self.size, dtype=np.int64), np.zeros(self.size, dtype=np.int64)
        for extent, stride in self.flat_modes():
            total += (index % extent) * stride
            index //= extent
        return total

    def __repr__(self) -> str:
        return f"{_text(self.shape)}:{_text(self.stride)}"


def make_layout(*layouts: Layout) -> Layout:
    """The concatenation (L0, L1, …): one mode per layout."""
    return Layout(tuple(a.shape for a in layouts), tuple(a.stride for a in layouts))


def _from_modes(modes) -> Layout:
    """A layout of flat (extent, stride) modes: 1:0 for none, an int layout for one."""
    if not modes:
        return Layout(1, 0)
    if len(modes) == 1:
        return Layout(*modes[0])
    return Layout(tuple(s for s, _ in modes), tuple(d for _, d in modes))


def _compact(shape, order) -> object:
    """Compact strides of `shape`, the flattened modes ranked by `order` (smallest varies fastest; ties by
    position)."""
    extents = flatten(shape)
    strides, step = [0] * len(extents), 1
    for i in sorted(range(len(extents)), key=lambda i: (order[i], i)):
        strides[i], step = step, step * extents[i]
    return unflatten(strides, shape)


def col_strides(shape):
    return _compact(shape, range(len(flatten(shape))))


def col_major(shape) -> Layout:
    """Compact, the first mode fastest (CuTe's LayoutLeft): (4, 3) -> (4,3):(1,4)."""
    return Layout(shape, col_strides(_tidy(shape)))


def row_major(shape) -> Layout:
    """Compact, the last flattened mode fastest (CuTe's LayoutRight): (2, (3, 4)) -> (2,(3,4)):(12,(4,1))."""
    shape = _tidy(shape)
    return Layout(shape, _compact(shape, range(len(flatten(shape)), 0, -1)))


def make_ordered_layout(shape, order) -> Layout:
    """Compact, the modes visited in `order` (congruent to shape): make_ordered_layout((2, 3, 4), (1, 2, 0)) ->
    (2,3,4):(4,8,1)."""
    shape, order = _tidy(shape), _tidy(order)
    if not congruent(shape, order):
        raise ValueError(f"order {_text(order)} must have the nesting of shape {_text(shape)}")
    return Layout(shape, _compact(shape, flatten(order)))


# ---- the algebra --------------------------------------------------------------------------------------------------
def coalesce(layout: Layout) -> Layout:
    """The same function of the 1-D index with the fewest modes: extent-1 modes dropped, and neighbours (s0:d0),
    (s1:d1) merged into s0·s1:d0 where d1 = s0·d0. coalesce((2,(1,6)):(1,(6,2))) = 12:1."""
    merged = []
    for extent, stride in layout.flat_modes():
        if extent == 1:
            continue
        if merged and stride == merged[-1][0] * merged[-1][1]:
            merged[-1] = (merged[-1][0] * extent, merged[-1][1])
        else:
            merged.append((extent, stride))
    return _from_modes(merged)


def _skip(modes: list, count: int) -> list:
    """The modes of the layout i -> A(count·i): the first `count` elements' worth divided out. The last mode is
    unbounded (extent None)."""
    modes = modes[:-1] + [(None, modes[-1][1])]
    while count > 1 and modes[0][0] is not None:
        extent, stride = modes[0]
        if count % extent == 0:
            modes, count = modes[1:], count // extent
        elif extent % count == 0:
            modes[0], count = (extent // count, stride * count), 1
        else:
            raise ValueError(f"composition: stride {count} neither divides nor is divided by extent {extent} of the "
                             f"left layout (CuTe's stride divisibility condition)")
    if count > 1:
        modes[0] = (None, modes[0][1] * count)
    return modes


def _keep(modes: list, count: int) -> list:
    """The first `count` elements of `modes` (the last unbounded) as flat modes."""
    kept = []
    for extent, stride in modes:
        if count == 1:
            break
        if extent is None or extent % count == 0:
            kept.append((count, stride))
            count = 1
        elif count % extent == 0:
            kept.append((extent, stride))
            count //= extent
        else:
            raise ValueError(f"composition: extent {extent} of the left layout neither divides nor is divided by "
                             f"{count} (CuTe's shape divisibility condition)")
    return kept


def _compose(modes: list, shape, stride):
    """(shape, stride) of A ∘ (shape:stride), A given as its coalesced flat modes; right-distributed over a tuple."""
    if not _is_int(shape):
        parts = [_compose(modes, s, d) for s, d in zip(shape, stride)]
        return tuple(s for s, _ in parts), tuple(d for _, d in parts)
    if stride == 0:
        return shape, 0
    result = _from_modes(_keep(_skip(modes, stride), shape))
    return result.shape, result.stride


def _as_layout(tile) -> Layout:
    return tile if isinstance(tile, Layout) else Layout(tile, 1)


def composition(a: Layout, b) -> Layout:
    """A ∘ B: (A ∘ B)(c) = A(B(c)) for every coordinate c of B, with B's shape. B is a layout, an int n (n:1), or a
    tuple of those (a tiler: composed mode by mode with A's modes). Raises ValueError where CuTe's divisibility
    conditions fail. composition((6,2):(8,2), (4,3):(3,1)) = ((2,2),3):((24,2),8)."""
    if isinstance(b, tuple):
        return _by_mode(a, b, composition)
    b = _as_layout(b)
    modes = coalesce(a).flat_modes()
    return Layout(*_compose(modes, b.shape, b.stride))


def _by_mode(a: Layout, tiler: tuple, op) -> Layout:
    if len(tiler) > a.rank:
        raise ValueError(f"a tiler of {len(tiler)} modes for {a}, of rank {a.rank}")
    parts = [op(a.mode(i), t) for i, t in enumerate(tiler)] + a.modes()[len(tiler):]
    return make_layout(*parts)


def complement(a: Layout, cotarget: int | None = None) -> Layout:
    """The layout of the offsets A does not reach, ordered, up to `cotarget` (default cosize(A)): (A, complement)
    covers 0 … cotarget − 1 once each where A is injective. complement(4:2, 24) = (2,3):(1,8)."""
    cotarget = a.cosize if cotarget is None else cotarget
    modes = sorted((d, s) for s, d in a.flat_modes() if s > 1 and d > 0)
    found, reached = [], 1
    for stride, extent in modes:
        if stride % reached:
            raise ValueError(f"complement: stride {stride} of {a} is not a multiple of {reached}, the span of the "
                             f"modes below it (A must be injective with strides dividing each other)")
        found.append((stride // reached, reached))
        reached = extent * stride
    found.append((-(-cotarget // reached), reached))
    return coalesce(_from_modes(found))


def logical_divide(a: Layout, tiler) -> Layout:
    """A split into (tile, rest): A ∘ (B, complement(B, size(A))). With a tuple tiler, each mode of A is divided
    by its own tile. logical_divide(24:1, 4:2) = (4,(2,3)):(2,(1,8))."""
    if isinstance(tiler, tuple):
        return _by_mode(a, tiler, logical_divide)
    tile = _as_layout(tiler)
    return composition(a, make_layout(tile, complement(tile, a.size)))


def zipped_divide(a: Layout, tiler) -> Layout:
    """logical_divide with the tiles' modes gathered first: ((tile modes), (rest modes)), so mode 0 indexes inside
    a tile and mode 1 picks the tile."""
    divided = logical_divide(a, tiler)
    if not isinstance(tiler, tuple):
        return divided
    tiled = divided.modes()[:len(tiler)]
    tiles = make_layout(*[m.mode(0) for m in tiled])
    rests = make_layout(*[m.mode(1) for m in tiled], *divided.modes()[len(tiler):])
    return make_layout(tiles, rests)


def right_inverse(a: Layout) -> Layout:
    """R with A(R(i)) = i for every i < size(R), R as large as A allows: the modes of A whose strides chain
    1, s0, s0·s1, …, each mapped back to its position in A's 1-D index."""
    flat = a.flat_modes()
    position = np.cumprod([1] + [s for s, _ in flat[:-1]]).tolist()
    found, reached = [], 1
    for stride, extent, where in sorted((d, s, p) for (s, d), p in zip(flat, position) if s > 1 and d > 0):
        if stride != reached:
            break
        found.append((extent, int(where)))
        reached *= extent
    return coalesce(_from_modes(found))


# ---- pictures -----------------------------------------------------------------------------------------------------
def index_table(layout: Layout) -> np.ndarray:
    """The offsets of a rank-2 layout as a table: row i, column j holds L(i, j), i over mode 0's size and j over
    mode 1's (a rank-1 layout is one column)."""
    if layout.rank > 2:
        raise ValueError(f"index_table draws rank-1 or rank-2 layouts; {layout} has rank {layout.rank}")
    rows = layout.mode(0).size
    return layout.offsets().reshape(layout.size // rows, rows).T


def draw(layout: Layout, ax=None, title: str | None = None):
    """The index table as a picture: one cell per coordinate (i, j), labelled with its offset and coloured by it,
    so equal offsets (stride 0) share a colour. Returns the matplotlib axes."""
    import matplotlib.pyplot as plt
    table = index_table(layout)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.5 * table.shape[1] + 1, 0.5 * table.shape[0] + 1))
    ax.imshow(table % 12, cmap="Set3", vmin=0, vmax=11)
    for (i, j), offset in np.ndenumerate(table):
        ax.text(j, i, str(offset), ha="center", va="center", fontsize=9)
    ax.set_xticks(range(table.shape[1]))
    ax.set_yticks(range(table.shape[0]))
    ax.tick_params(length=0, labeltop=True, labelbottom=False)
    ax.set_title(title or repr(layout), pad=14)  # above the column numbers
    return ax
