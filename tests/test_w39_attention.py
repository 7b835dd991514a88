"""Week 39's attention kernels against NumPy and PyTorch compositions of what they fuse: RoPE and ALiBi inside
attention, the output projection in attention's epilogue, RoPE in the QKV projection's epilogue. Runs in the
interpreter on CPU (float32, float16) and on a GPU (bfloat16 too)."""
import numpy as np
import pytest
import torch

from course import backend
from course.w35_attention_blocks import reference as ref35
from course.w39_kernel_fusion import reference as ref
from course.w39_kernel_fusion import tasks
from solutions import w39_kernel_fusion as s

DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if backend.ON_GPU else [])
# largest error allowed: float32 arithmetic, or one rounding of the rotated q and k and of P to the dtype (a few units)
UNIT = {torch.float32: 1e-5, torch.float16: 4 * 2.0 ** -9, torch.bfloat16: 4 * 2.0 ** -6}
# (B, H, M, N, d): N = 1, odd lengths, M != N both ways, halves of no power of two, several blocks
SHAPES = [(1, 1, 1, 1, 16), (2, 3, 37, 37, 32), (1, 2, 45, 70, 16), (1, 2, 70, 45, 64), (1, 1, 33, 33, 48)]


def heads(shape, dtype, seed):
    b, h, m, n, d = shape
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, rows, d, generator=g).to(backend.DEVICE, dtype) for rows in (m, n, n)]


def f64(*tensors):
    return [t.double().cpu().numpy() for t in tensors]


def close(got, expected, dtype, lse=False):
    atol = 1e-4 if lse and dtype == torch.float32 else UNIT[dtype]
    np.testing.assert_allclose(got.double().cpu().numpy(), expected, atol=atol, rtol=0)


def tables(length, d, dtype=torch.float32):
    return [torch.from_numpy(t).to(backend.DEVICE, dtype) for t in ref35.rope_tables(length, d)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_attention_is_rope_then_attention(shape, causal, dtype):
    q, k, v = heads(shape, dtype, seed=sum(shape))
    cos, sin = tables(max(shape[2], shape[3]), shape[4], dtype)
    o, lse = s.rope_attention(q, k, v, cos, sin, causal=causal)
    o_ref, lse_ref = ref.rope_attention(*f64(q, k, v, cos, sin), causal=causal)
    close(o, o_ref, dtype)
    close(lse, lse_ref, dtype, lse=True)


def test_rope_attention_equals_the_unfused_kernels_and_depends_on_relative_positions_only():
    q, k, v = heads((2, 2, 50, 50, 32), torch.float32, seed=3)
    cos, sin = tables(120, 32)
    q_rot, k_rot = (torch.from_numpy(ref.rotated(x, *f64(cos, sin))).float().to(backend.DEVICE) for x in f64(q, k))
    fused, unfused = s.rope_attention(q, k, v, cos, sin, causal=True), s.flash_attention(q_rot, k_rot, v, causal=True)
    for a, b in zip(fused, unfused):
        np.testing.assert_allclose(a.cpu().numpy(), b.cpu().numpy(), atol=2e-5, rtol=0)
    # RoPE encodes i - j only: moving every position by 70 (tables' rows 70 ...) changes nothing
    shifted = s.rope_attention(q, k, v, cos[70:], sin[70:], causal=True)[0]
    np.testing.assert_allclose(shifted.cpu().numpy(), fused[0].cpu().numpy(), atol=2e-5, rtol=0)
    # and RoPE does something: without it the output differs
    assert np.abs(s.flash_attention(q, k, v, causal=True)[0].cpu().numpy() - fused[0].cpu().numpy()).max() > 1e-2


def test_rope_attention_takes_non_contiguous_heads():
    b, h, n, d = 2, 3, 37, 64
    q, k, v = (torch.randn(b, n, h, d).to(backend.DEVICE).transpose(1, 2) for _ in range(3))
    cos, sin = tables(n, d)
    o, lse = s.rope_attention(q, k, v, cos, sin, causal=True)
    o_ref, lse_ref = ref.rope_attention(*f64(q, k, v, cos, sin), causal=True)
    close(o, o_ref, torch.float32)
    close(lse, lse_ref, torch.float32, lse=True)


@pytest.mark.parametrize("shape", SHAPES[1:], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flash_and_alibi_attention_match_the_reference(shape, causal, dtype):
    q, k, v = heads(shape, dtype, seed=7 * sum(shape))
    slopes = ref35.alibi_slopes(shape[1]) if shape[1] in (1, 2, 4) else np.array([0.5, 0.125, 0.03125])
    for got, (o_ref, lse_ref) in ((s.flash_attention(q, k, v, causal=causal), ref.attention_with(*f64(q, k, v),
                                                                                               causal=causal)),
                                  (s.alibi_attention(q, k, v, slopes, causal=causal),
                                   ref.alibi_attention(*f64(q, k, v), slopes, causal=causal))):
        close(got[0], o_ref, dtype)
        close(got[1], lse_ref, dtype, lse=True)


def test_alibi_changes_the_output_and_a_zero_slope_is_plain_attention():
    q, k, v = heads((1, 2, 40, 40, 32), torch.float32, seed=11)
    plain = s.flash_attention(q, k, v)[0].cpu().numpy()
    zero = s.alibi_attention(q, k, v, [0.0, 0.0])[0].cpu().numpy()
    np.testing.assert_allclose(zero, plain, atol=1e-6, rtol=0)
    assert np.abs(s.alibi_attention(q, k, v, [0.5, 0.25])[0].cpu().numpy() - plain).max() > 1e-2


@pytest.mark.parametrize("c_out,causal,bias", [(16, False, False), (80, True, True), (150, False, True)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_output_projection_is_attention_then_the_gemm(c_out, causal, bias, dtype):
    b, h, m, n, d = 2, 3, 37, 45, 16  # C = 80 and 150: several column blocks, the last partial
    q, k, v = heads((b, h, m, n, d), dtype, seed=c_out)
    w = (torch.randn(c_out, h * d) / (h * d) ** 0.5).to(backend.DEVICE, dtype)
    b_o = torch.randn(c_out).to(backend.DEVICE, dtype) if bias else None
    y = s.attention_output_projection(q, k, v, w, b_o, causal=causal)
    assert y.shape == (b, m, c_out) and y.dtype == dtype
    expected = ref.attention_output_projection(*f64(q, k, v, w), None if b_o is None else f64(b_o)[0], causal=causal)
    np.testing.assert_allclose(y.double().cpu().numpy(), expected, atol=2 * UNIT[dtype], rtol=0)


@pytest.mark.parametrize("shape", [(1, 1, 1, 16), (2, 37, 3, 32), (1, 45, 2, 48)], ids=str)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_qkv_rope_projection_is_the_gemm_then_rope(shape, bias, dtype):
    b, n, h, d = shape
    g = torch.Generator().manual_seed(n * d)
    x = torch.randn(b, n, h * d, generator=g).to(backend.DEVICE, dtype)
    w = (torch.randn(3 * h * d, h * d, generator=g) / (h * d) ** 0.5).to(backend.DEVICE, dtype)
    b_qkv = torch.randn(3 * h * d, generator=g).to(backend.DEVICE, dtype) if bias else None
    cos, sin = tables(n + 5, d, dtype)
    got = s.qkv_rope_projection(x, w, b_qkv, cos, sin, h)
    expected = ref.qkv_rope_projection(*f64(x, w), None if b_qkv is None else f64(b_qkv)[0], *f64(cos, sin), h)
    for a, e in zip(got, expected):
        assert a.shape == (b, h, n, d)
        np.testing.assert_allclose(a.double().cpu().numpy(), e, atol=2 * UNIT[dtype] * max(1, np.abs(e).max()), rtol=0)
    assert got[0].data_ptr() + h * d * got[0].element_size() == got[1].data_ptr()  # views of one (B, N, 3, H, d)


def test_rope_in_the_projection_or_in_attention_is_the_same_attention():
    """The two full fusions agree: RoPE in the QKV GEMM's epilogue then plain attention, or the plain GEMM then
    RoPE in attention's prologue (identity tables, cos = 1 and sin = 0, turn the fused GEMM into the plain one)."""
    b, n, h, d = 2, 40, 2, 32
    x, w = torch.randn(b, n, h * d).to(backend.DEVICE), (torch.randn(3 * h * d, h * d) / 8).to(backend.DEVICE)
    cos, sin = tables(n, d)
    in_gemm = s.flash_attention(*s.qkv_rope_projection(x, w, None, cos, sin, h), causal=True)[0]
    plain = s.qkv_rope_projection(x, w, None, torch.ones_like(cos), torch.zeros_like(sin), h)
    in_attention = s.rope_attention(*plain, cos, sin, causal=True)[0]
    np.testing.assert_allclose(in_gemm.cpu().numpy(), in_attention.cpu().numpy(), atol=2e-5, rtol=0)


def test_arguments_are_checked():
    q, k, v = heads((1, 2, 8, 8, 16), torch.float32, seed=0)
    cos, sin = tables(8, 16)
    with pytest.raises(ValueError, match="at least 8"):
        s.rope_attention(q, k, v, cos[:5], sin[:5])
    with pytest.raises(ValueError, match="even head_dim"):
        odd = torch.randn(1, 2, 8, 15).to(backend.DEVICE)
        s.rope_attention(odd, odd, odd, cos, sin)
    with pytest.raises(ValueError, match="share"):
        s.rope_attention(q, k.half(), v, cos, sin)
    with pytest.raises(ValueError, match="float16, bfloat16 or float32"):
        s.flash_attention(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match="one value per head"):
        s.alibi_attention(q, k, v, None)
    with pytest.raises(ValueError, match="2 values"):
        s.alibi_attention(q, k, v, [0.5, 0.25, 0.125])
    with pytest.raises(ValueError, match="H·d = 32"):
        s.attention_output_projection(q, k, v, torch.randn(16, 30).to(backend.DEVICE))
    x = torch.randn(1, 8, 32).to(backend.DEVICE)
    with pytest.raises(ValueError, match="divisible by n_heads"):
        s.qkv_rope_projection(x, torch.randn(96, 32).to(backend.DEVICE), None, cos, sin, 3)
    if backend.DEVICE != "cpu":
        with pytest.raises(ValueError, match="device"):
            s.rope_attention(q.cpu(), k.cpu(), v.cpu(), cos, sin)


def test_cost_models_by_hand():
    # RoPE fused saves the rotary pass: read q and k, write them rotated, (M + N)·d elements each way per head
    saved = ref.rope_attention_bytes(8, 100, 300, 64, 2)
    assert saved["unfused"] - saved["fused"] == 2 * 8 * 400 * 64 * 2
    # one column block: the output projection's fusion saves O and the LSE and recomputes nothing
    small = ref.output_projection_cost(1, 2, 128, 128, 64, 128, 2, block_m=64, block_c=128)
    assert small["fused"]["flops"] == small["unfused"]["flops"]
    # unfused: O and the LSE written, O read back; fused: W_O read once per query block (twice here, once unfused)
    o_and_lse, o_back, w_o_again = 2 * 128 * (64 * 2 + 4), 2 * 128 * 64 * 2, 128 * 128 * 2
    assert small["unfused"]["bytes"] - small["fused"]["bytes"] == o_and_lse + o_back - w_o_again
    # C = 1024 in blocks of 128: the attention runs 8 times
    wide = ref.output_projection_cost(1, 16, 1024, 1024, 64, 1024, 2, block_c=128)
    gemm = 2 * 1024 * 16 * 64 * 1024
    assert wide["fused"]["flops"] - gemm == 8 * (wide["unfused"]["flops"] - gemm)
    assert wide["fused"]["bytes"] > wide["unfused"]["bytes"]


def test_the_grader_names_a_rotated_v_and_passes_the_right_answer():
    rng = np.random.default_rng(5)
    case = next(c for c in tasks.rope_attention_cases(rng, ("float32",)) if c.name.startswith("causal, odd lengths"))
    q, k, v, cos, sin = case.inputs
    expected = ref.rope_attention(q, k, v, cos, sin, causal=True)
    wrong = ref.attention_with(ref.rotated(q, cos, sin), ref.rotated(k, cos, sin), ref.rotated(v, cos, sin),
                               causal=True)
    case.output = "o"
    assert tasks.rope_attention_hint(case, wrong[0], expected[0]) == tasks.ROPE_V
    assert tasks.rope_attention_hint(case, expected[0], expected[0]) is None
    assert tasks.composition_rule(q, k, v, cos, sin, "float32") is None
    atol, rtol, why = tasks.composition_rule(q, k, v, cos, sin, "float16", causal=True)
    assert 1e-4 < atol < 1e-2 and rtol == 0 and "unfused" in why
