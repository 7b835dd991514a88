"""Week 40's attention kernels against the float64 references: causal chunked linear attention (both feature maps,
any chunk), block-sparse attention forward and backward under window, causal and document masks, and their errors on
bad input. Small shapes: they run in Triton's interpreter on CPU and on a GPU alike."""
import numpy as np
import pytest
import torch

import course
from course.w40_advanced_fusion import reference as ref

k40 = course.kernels("w40_advanced_fusion")
DTYPE = torch.float32
TOL = 2e-5


def tensors(*arrays, grad=False):
    return [torch.tensor(a, dtype=DTYPE, device=course.DEVICE, requires_grad=grad) for a in arrays]


def as_np(t):
    return t.detach().cpu().double().numpy()


@pytest.mark.parametrize("feature", ["elu1", "relu"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 16, 16), (2, 3, 37, 32, 32), (1, 2, 100, 48, 24)])
def test_causal_linear_attention_matches_the_quadratic_form(feature, shape):
    b, h, n, d, dv = shape
    rng = np.random.default_rng(n)
    q, k, v = rng.normal(0, 1, (b, h, n, d)), rng.normal(0, 1, (b, h, n, d)), rng.normal(0, 1, (b, h, n, dv))
    got = as_np(k40.causal_linear_attention(*tensors(q, k, v), feature=feature))
    np.testing.assert_allclose(got, ref.linear_attention(q, k, v, feature)[0], atol=TOL, rtol=TOL)


def test_the_chunk_size_changes_nothing_but_rounding():
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(0, 1, (1, 2, 90, 32)) for _ in range(3))
    small, large = (as_np(k40.causal_linear_attention(*tensors(q, k, v), chunk=c)) for c in (16, 32))
    np.testing.assert_allclose(small, large, atol=TOL, rtol=TOL)
    np.testing.assert_allclose(ref.chunked_linear_attention(q, k, v, 7)[0], ref.linear_attention(q, k, v)[0],
                               atol=1e-12)


def test_the_reordered_form_equals_the_quadratic_one_without_a_mask():
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(0, 1, (2, 40, 8)) for _ in range(3))
    np.testing.assert_allclose(ref.linear_attention_reordered(q, k, v)[0],
                               ref.linear_attention(q, k, v, causal=False)[0], atol=1e-12)


def test_linear_attention_explains_bad_input():
    q = torch.zeros(1, 1, 8, 16, device=course.DEVICE)
    with pytest.raises(ValueError, match="unknown feature map"):
        k40.causal_linear_attention(q, q, q, feature="softmax")
    with pytest.raises(ValueError, match="same shape"):
        k40.causal_linear_attention(q, torch.zeros(1, 1, 9, 16, device=course.DEVICE), q)


MASKS = [("window", 100, True, 40, None), ("causal", 70, True, None, None), ("window both ways", 64, False, 20, None),
         ("documents", 90, True, None, np.repeat([0, 1, 2], [30, 45, 15]))]


@pytest.mark.parametrize("name,n,causal,window,documents", MASKS, ids=[m[0] for m in MASKS])
def test_sparse_attention_forward_and_backward_match_the_masked_reference(name, n, causal, window, documents):
    rng = np.random.default_rng(n)
    q, k, v, do = (rng.normal(0, 1, (1, 2, n, 32)) for _ in range(4))
    pattern = k40.SparsePattern(n, causal, window, documents)
    keep = ref.token_mask(n, n, causal, window, documents)
    leaves = tensors(q, k, v, grad=True)
    o = k40.sparse_attention(*leaves, pattern)
    o.backward(tensors(do)[0])
    np.testing.assert_allclose(as_np(o), ref.masked_attention(q, k, v, keep)[0], atol=1e-5, rtol=1e-5)
    for leaf, expected in zip(leaves, ref.masked_attention_backward(q, k, v, do, keep)):
        np.testing.assert_allclose(as_np(leaf.grad), expected, atol=1e-5, rtol=1e-5)


def test_sparse_attention_takes_strided_heads():
    rng = np.random.default_rng(3)
    n = 48
    packed = torch.tensor(rng.normal(0, 1, (1, n, 3, 2, 32)), dtype=DTYPE, device=course.DEVICE)
    q, k, v = packed.permute(2, 0, 3, 1, 4).unbind(0)  # (1, 2, n, 32) views, not contiguous
    pattern = k40.SparsePattern(n, True, 16)
    o, _ = k40.sparse_attention_forward(q, k, v, pattern)
    expected = ref.masked_attention(*(as_np(t) for t in (q, k, v)), ref.token_mask(n, n, True, 16))[0]
    np.testing.assert_allclose(as_np(o), expected, atol=1e-5, rtol=1e-5)


def test_the_pattern_lists_are_the_reference_tile_lists():
    n, window = 200, 50
    pattern = k40.SparsePattern(n, True, window)
    keep = ref.token_mask(n, n, True, window)
    for listed, expected in zip(pattern.by_query, ref.tile_lists(keep, pattern.block, pattern.block)):
        np.testing.assert_array_equal(listed.cpu().numpy(), expected)
    assert 0 < pattern.density < 1


def test_sparse_attention_explains_a_pattern_of_another_length():
    q = torch.zeros(1, 1, 32, 16, device=course.DEVICE)
    with pytest.raises(ValueError, match="SparsePattern over the sequence's 32 positions"):
        k40.sparse_attention_forward(q, q, q, k40.SparsePattern(64))
