"""Week 35 kernels beyond the graders: the fused QKV projection's views, the in-place float32 -> 16-bit
softmax, argument errors, and (on a GPU) bf16 attention at a length past every block against SDPA."""
import math

import numpy as np
import pytest
import torch

from course import backend
from course.w35_attention_blocks import reference as ref
from solutions import w35_attention_blocks as s

DEV = backend.DEVICE


def test_qkv_projection_gives_strided_views_that_the_kernels_take_without_copies():
    torch.manual_seed(0)
    bsz, n, heads, d = 2, 19, 3, 16
    x = torch.randn(bsz, n, heads * d, device=DEV)
    w, b = torch.randn(3 * heads * d, heads * d, device=DEV) / 8, torch.randn(3 * heads * d, device=DEV)
    q, k, v = s.qkv_projection(x, w, b, heads)
    assert q.shape == (bsz, heads, n, d) and not q.is_contiguous() and q.stride(-1) == 1
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()  # one GEMM, one buffer
    wq, wk, wv = w.split(heads * d)
    bq, bk, bv = b.split(heads * d)
    for got, wi, bi in ((q, wq, bq), (k, wk, bk), (v, wv, bv)):
        want = (x @ wi.T + bi).view(bsz, n, heads, d).transpose(1, 2)
        torch.testing.assert_close(got, want)
    o = s.attention(q, k, v, causal=True)
    want = ref.attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=True)
    np.testing.assert_allclose(o.double().cpu().numpy(), want, atol=1e-5, rtol=1e-4)


def test_softmax_writes_16_bit_probabilities_over_its_float32_scores():
    torch.manual_seed(1)
    scores = torch.randn(2, 2, 9, 21, device=DEV) * 3
    expected = ref.scale_mask_softmax(scores.double().cpu().numpy(), 0.5, causal=True, key_lengths=np.array([21, 4]))[0]
    probs = scores.view(torch.float16)[..., :21]
    out = s.scale_mask_softmax(scores, out=probs, scale=0.5, causal=True, key_lengths=[21, 4])
    assert out.data_ptr() == scores.data_ptr()
    np.testing.assert_allclose(out.double().cpu().numpy(), expected, atol=1e-3, rtol=2e-3)
    assert (out[0, :, 0, 1:] == 0).all() and (out[1, :, :, 4:] == 0).all()


@pytest.mark.parametrize("call, match", [
    (lambda q: s.qk_scores(q[0], q), "batch, heads, length, head_dim"),
    (lambda q: s.qk_scores(q, q[..., :8]), "do not match"),
    (lambda q: s.scale_mask_softmax(q, key_lengths=[1, 2, 3]), "key_lengths must hold 2"),
    (lambda q: s.scale_mask_softmax(q, key_lengths=[-1, 2]), "non-negative"),
    (lambda q: s.scale_mask_softmax(q, alibi_slopes=[1.0]), "alibi_slopes must hold 3"),
    (lambda q: s.rope(q, *(torch.ones(5, 8),) * 2), "cos, sin of shape"),
    (lambda q: s.qk_scores(q, q, out=torch.empty(1)), "out must be"),
    (lambda q: s.pv(q.transpose(2, 3), q), "p must be"),
])
def test_bad_arguments_are_refused_with_a_clear_error(call, match):
    q = torch.randn(2, 3, 16, 16, device=DEV)
    with pytest.raises(ValueError, match=match):
        call(q)


@pytest.mark.skipif(not backend.ON_GPU, reason="bf16 and long rows need a GPU (the interpreter's bf16 is wrong)")
@pytest.mark.parametrize("causal", [False, True])
def test_bf16_attention_past_every_block_meets_flashattentions_rule(causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 4, 1000, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    with sdpa_kernel(SDPBackend.MATH):
        pt = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    err_pt = (pt.float() - want).abs().max().item()
    err = (s.attention(q, k, v, causal=causal).float() - want).abs().max().item()
    assert err <= 2 * err_pt + 2.0 ** -8 * want.abs().max().item(), (err, err_pt)
    assert math.isfinite(err)


@pytest.mark.skipif(not backend.ON_GPU, reason="6.4 GB of scores: a GPU test")
def test_softmax_offsets_past_two_to_the_31_elements():
    """(3, 16, 8192, 8192) bf16 scores: batch entry 2 starts at element 2^31, past a 32-bit offset."""
    import torch
    from solutions import w35_attention_blocks as s
    scores = torch.randn(3, 16, 8192, 8192, device="cuda", dtype=torch.bfloat16)
    last = scores[2, 15, -3:].float()
    s.scale_mask_softmax(scores, out=scores, scale=0.5, causal=True)
    keep = torch.arange(8192, device="cuda")[None, :] <= torch.arange(8189, 8192, device="cuda")[:, None]
    want = torch.softmax((last * 0.5).masked_fill(~keep, float("-inf")), dim=-1)
    assert (scores[2, 15, -3:].float() - want).abs().max().item() < 2 ** -8
