"""Week 40, day 1: CuTe's layout algebra (course/w40_advanced_fusion/layout.py) against the worked examples of
NVIDIA's CuTe documentation and by its defining properties; the grader of w40.layout_index accepts a correct
solution and names each known slip."""
import math

import numpy as np
import pytest

from course import mutants, registry
from course.grading import GradingError, check
from course.w40_advanced_fusion import cute_tasks
from course.w40_advanced_fusion.layout import (Layout, coalesce, col_major, complement, composition, crd2idx, draw,
                                               flatten, idx2crd, index_table, logical_divide, make_layout,
                                               make_ordered_layout, right_inverse, row_major, unflatten, zipped_divide)

DOCS = Layout((4, (2, 2)), (2, (1, 8)))


# ---------------------------------------------------------------- the layout and its coordinates
def test_the_docs_example_layout():
    assert (DOCS.size, DOCS.cosize, DOCS.rank, DOCS.depth) == (16, 16, 2, 2)
    assert repr(DOCS) == "(4,(2,2)):(2,(1,8))" and repr(Layout(8, 2)) == "8:2"
    assert DOCS(1) == 2 and DOCS(4) == 1 and DOCS(8) == 8  # colex: mode 0 first, then the nested (2,2) in order
    assert DOCS((3, (1, 1))) == 3 * 2 + 1 + 8 == DOCS(3, 3)  # natural coordinate, or an int for the nested mode
    assert index_table(DOCS).tolist() == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]


def test_idx2crd_is_colexicographic():
    assert idx2crd(1, (4, (2, 2))) == (1, (0, 0))
    assert idx2crd(4, (4, (2, 2))) == (0, (1, 0))
    assert idx2crd(13, (4, (2, 2))) == (1, (1, 1))
    assert idx2crd(7, (2, 3)) == (1, 3)  # past the end: the last mode takes the whole quotient, as in CuTe


def test_crd2idx_and_idx2crd_round_trip():
    rng = np.random.default_rng(0)
    for shape in [(3, (2, 5)), ((2, 2), 3, (4, 1)), 7, ((3,),)]:
        stride = col_major(shape).stride
        for i in range(Layout(shape).size):
            assert crd2idx(idx2crd(i, shape), shape, stride) == i
        coord = idx2crd(int(rng.integers(0, Layout(shape).size)), shape)
        assert idx2crd(crd2idx(coord, shape, stride), shape) == coord


def test_layouts_are_checked():
    with pytest.raises(ValueError, match="congruent"):
        Layout((4, (2, 2)), (2, 1))
    with pytest.raises(ValueError, match=">= 1"):
        Layout((4, 0), (1, 4))
    assert Layout((4, 3)) == col_major((4, 3)) == Layout((4, 3), (1, 4))


def test_orderings():
    assert row_major((2, (3, 4))) == Layout((2, (3, 4)), (12, (4, 1)))
    assert col_major((2, (3, 4))) == Layout((2, (3, 4)), (1, (2, 6)))
    assert make_ordered_layout((2, 3, 4), (1, 2, 0)) == Layout((2, 3, 4), (4, 8, 1))


# ---------------------------------------------------------------- the algebra: the documentation's examples
def test_coalesce():
    assert coalesce(Layout((2, (1, 6)), (1, (6, 2)))) == Layout(12, 1)
    assert coalesce(Layout((2, 4), (4, 1))) == Layout((2, 4), (4, 1))  # 1 ≠ 2·4: nothing merges
    assert coalesce(Layout((1, 1), (3, 7))) == Layout(1, 0)


@pytest.mark.parametrize("a,b,expected", [
    (Layout(20, 2), Layout((5, 4), (4, 1)), Layout((5, 4), (8, 2))),
    (Layout((10, 2), (16, 4)), Layout((5, 4), (1, 5)), Layout((5, (2, 2)), (16, (80, 4)))),
    (Layout((6, 2), (8, 2)), Layout((4, 3), (3, 1)), Layout(((2, 2), 3), ((24, 2), 8))),
])
def test_composition_examples(a, b, expected):
    got = composition(a, b)
    assert got == expected
    assert got.offsets().tolist() == a.offsets()[b.offsets()].tolist()


def test_composition_refuses_what_cute_cannot_divide():
    with pytest.raises(ValueError, match="stride divisibility"):
        composition(Layout((3, 4), (1, 5)), Layout(2, 2))
    with pytest.raises(ValueError, match="shape divisibility"):
        composition(Layout((4, 3), (1, 5)), Layout(6, 1))


@pytest.mark.parametrize("a,cotarget,expected", [
    (Layout(4, 1), 24, Layout(6, 4)), (Layout(6, 4), 24, Layout(4, 1)),
    (Layout((4, 6), (1, 4)), 24, Layout(1, 0)), (Layout(4, 2), 24, Layout((2, 3), (1, 8))),
    (Layout((2, 4), (1, 6)), 24, Layout(3, 2)), (Layout((2, 2), (1, 6)), 24, Layout((3, 2), (2, 12))),
])
def test_complement_examples(a, cotarget, expected):
    got = complement(a, cotarget)
    assert got == expected
    assert sorted(make_layout(a, got).offsets().tolist()) == list(range(cotarget))  # together: each offset once


def test_logical_divide_of_a_vector_by_a_tile():
    # 24 elements in tiles of 4 taken two apart: the tile 4:2, the rest (which tile) (2,3):(1,8)
    assert logical_divide(Layout(24, 1), Layout(4, 2)) == Layout((4, (2, 3)), (2, (1, 8)))
    assert logical_divide(Layout((4, 2, 3), (2, 1, 8)), Layout(4, 2)) == Layout(((2, 2), (2, 3)), ((4, 1), (2, 8)))
    assert logical_divide(Layout(12, 1), 4) == Layout((4, 3), (1, 4))  # an int tile n is n:1


def test_divides_of_a_matrix_by_a_tiler():
    a = Layout((9, (4, 8)), (59, (13, 1)))
    tiler = (Layout(3, 3), Layout((2, 4), (1, 8)))
    assert logical_divide(a, tiler) == Layout(((3, 3), ((2, 4), (2, 2))), ((177, 59), ((13, 2), (26, 1))))
    zipped = zipped_divide(a, tiler)
    assert zipped == Layout(((3, (2, 4)), (3, (2, 2))), ((177, (13, 2)), (59, (26, 1))))
    assert sorted(zipped.offsets().tolist()) == sorted(a.offsets().tolist())  # a rearrangement of A's offsets


# ---------------------------------------------------------------- the algebra: properties on random layouts
def _random_shape(rng, size_cap):
    """Extents powers of two (so CuTe's divisibility conditions always hold), up to 3 modes, one maybe nested."""
    while True:
        shape = tuple(int(2 ** rng.integers(0, 4)) for _ in range(int(rng.integers(1, 4))))
        if rng.random() < 0.5 and len(shape) > 1:
            shape = (shape[0], tuple(shape[1:]))
        if Layout(shape).size <= size_cap:
            return shape


def _random_layout(rng, size_cap):
    shape = _random_shape(rng, size_cap)
    return Layout(shape, unflatten([int(d) for d in rng.integers(0, 30, len(flatten(shape)))], shape))


def _random_tiler(rng, size_cap):
    """A layout B whose modes pick disjoint bits of the index (compact in a random order, spread by a power of two,
    maybe one mode broadcast): A(B(x) + B(y)) = A(B(x)) + A(B(y)) across its modes, so A ∘ B is a layout."""
    shape = _random_shape(rng, size_cap)
    n = len(flatten(shape))
    spread = int(2 ** rng.integers(0, 3))
    order = unflatten([int(k) for k in rng.permutation(n)], shape)
    strides = [d * spread for d in flatten(make_ordered_layout(shape, order).stride)]
    if rng.random() < 0.3:
        strides[int(rng.integers(0, n))] = 0
    return Layout(shape, unflatten(strides, shape))


def test_composition_is_the_index_table_of_a_of_b():
    rng = np.random.default_rng(1)
    tried = 0
    for _ in range(300):
        a, b = _random_layout(rng, 64), _random_tiler(rng, 64)
        if b.cosize > a.size:
            continue
        got, tried = composition(a, b), tried + 1
        assert got.offsets().tolist() == a.offsets()[b.offsets()].tolist(), (a, b, got)
        assert got.size == b.size and got.rank == b.rank
    assert tried > 100


def test_coalesce_and_right_inverse_properties():
    rng = np.random.default_rng(2)
    for _ in range(200):
        a = _random_layout(rng, 256)
        assert coalesce(a).offsets().tolist() == a.offsets().tolist()
        inverse = right_inverse(a)
        assert a.offsets()[inverse.offsets()].tolist() == list(range(inverse.size))
    assert right_inverse(row_major((4, 8))).size == 32


def test_draw_labels_every_cell():
    import matplotlib.pyplot as plt
    ax = draw(DOCS)
    assert sorted(int(t.get_text()) for t in ax.texts) == list(range(16))
    assert ax.get_title() == "(4,(2,2)):(2,(1,8))"
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="rank"):
        index_table(Layout((2, 2, 2)))


# ---------------------------------------------------------------- the grader of w40.layout_index
@pytest.fixture
def graded(monkeypatch):
    """w40.layout_index as the registry knows it (added here until week 40's tasks.py lists it)."""
    known = registry.all_tasks()
    if "w40.layout_index" not in known:
        extra = {t.id: t for t in cute_tasks.CUTE_TASKS}
        monkeypatch.setattr(registry, "all_tasks", lambda: {**known, **extra})


def _flat(t):
    return [t] if isinstance(t, int) else [x for m in t for x in _flat(m)]


def _walked(modes):
    index, total = np.arange(math.prod(e for e, _ in modes)), 0
    for extent, step in modes:
        total, index = total + (index % extent) * step, index // extent
    return np.asarray(total, dtype=np.float64).reshape(-1)


def _tops(shape, stride):
    return list(zip(shape, stride)) if isinstance(shape, tuple) else [(shape, stride)]


def recursive(shape, stride):
    """Right, written another way: a mode's offsets, the earlier modes' repeated inside each of its coordinates."""
    if isinstance(shape, int):
        return np.arange(shape) * float(stride)
    offsets = np.zeros(1)
    for s, d in zip(shape, stride):
        offsets = (recursive(s, d)[:, None] + offsets[None, :]).reshape(-1)
    return offsets


SLIPS = {  # a learner's wrong layout_index -> words its hint must contain
    cute_tasks.ROW_MAJOR: lambda shape, stride: _walked(list(zip(_flat(shape), _flat(stride)))[::-1]),
    cute_tasks.NESTED_ORDER: lambda shape, stride: _walked([m for s, d in _tops(shape, stride)
                                                            for m in list(zip(_flat(s), _flat(d)))[::-1]]),
    cute_tasks.STRIDES_SWAPPED: lambda shape, stride: _walked(list(zip(_flat(shape), _flat(stride)[::-1]))),
    cute_tasks.TOP_LEVEL_ONLY: lambda shape, stride: _walked([(math.prod(_flat(s)), _flat(d)[0])
                                                              for s, d in _tops(shape, stride)]),
    cute_tasks.NOT_DIVIDED: lambda shape, stride: sum(
        (np.arange(math.prod(_flat(shape))) % e) * float(d) for e, d in zip(_flat(shape), _flat(stride))),
}


@pytest.mark.parametrize("seed", range(3))
def test_the_grader_accepts_a_correct_solution(graded, seed):
    assert check("w40.layout_index", recursive, seed=seed).cases >= 15


@pytest.mark.parametrize("hint", list(SLIPS), ids=["row-major", "nested order", "strides swapped", "top level only",
                                                   "not divided"])
def test_the_grader_names_each_slip(graded, hint):
    for seed in range(3):
        with pytest.raises(GradingError) as err:
            check("w40.layout_index", SLIPS[hint], seed=seed)
        assert hint in str(err.value)


def _merged_mutants() -> list:
    """(index, mutant) of w40.layout_index's mutants, once week 40's tasks.py, solution and mutants list it."""
    declared = mutants.ROOT / "tests" / "mutants" / "w40_advanced_fusion.py"
    if "w40_advanced_fusion" not in registry.WEEKS or not declared.exists():
        return []
    return [(i, m) for i, m in enumerate(mutants.declared("w40_advanced_fusion")) if m.exercise == "w40.layout_index"]


MERGED = _merged_mutants()


@pytest.mark.skipif(not MERGED, reason="solutions/ and tests/mutants/ hold no w40.layout_index yet")
@pytest.mark.parametrize("index,mutant", MERGED, ids=[m.bug for _, m in MERGED])
def test_the_solutions_mutants_are_rejected_with_their_hint(index, mutant):
    status, detail = mutants.verdict(mutant, index)
    assert status == "rejected", detail
