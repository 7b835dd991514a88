"""Week 39, days 1-2: the byte model's table and worked examples, and the kernels without an exercise of their own
(SiLU, SwiGLU, GeGLU, the autograd Functions, the CUDA C bias + GELU, the GEMM with a GELU epilogue) against PyTorch
in float64, and the launchers' errors. Runs on CPU (interpreter) or GPU."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from course import DEVICE, cuda
from course.w39_kernel_fusion import reference as ref
from solutions import w39_kernel_fusion as s

APPROXIMATIONS = ("none", "tanh")


def _randn(*shape, dtype=torch.float32, scale=2.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g, dtype=torch.float64)).to(device=DEVICE, dtype=dtype)


def _close(got, expected, rtol, atol, what=""):
    np.testing.assert_allclose(got.double().cpu().numpy(), expected.double().cpu().numpy(), rtol=rtol, atol=atol,
                               err_msg=what)


# ---------------------------------------------------------------- day 1: the byte model
def test_the_exercise_shows_the_graders_table():
    assert s.OPS == ref.OPS and s.STAT_BYTES == ref.STAT_BYTES


def test_fusion_bytes_worked_examples():
    # bias + GELU on (4096, 4096) fp16: unfused, two kernels each read and write 32 MiB; fused, one read and one
    # write. The bias is read once either way (by the bias kernel, or by the fused one).
    tensor = 4096 * 4096 * 2
    assert s.fusion_bytes(("bias", "gelu"), 4096, 4096, 2) == (4 * tensor + 4096 * 2, 2 * tensor + 4096 * 2)
    # dropout + residual + LayerNorm, (8, 16) fp32: the residual (m, n), weight and bias (n), mean and rstd (m, f32)
    tensor, extras = 8 * 16 * 4, 8 * 16 * 4 + 2 * 16 * 4 + 2 * 8 * 4
    assert s.fusion_bytes(("dropout", "residual", "layernorm"), 8, 16, 4) == (6 * tensor + extras, 2 * tensor + extras)
    # one op: nothing to fuse
    assert s.fusion_bytes(("rmsnorm",), 3, 5, 2)[0] == s.fusion_bytes(("rmsnorm",), 3, 5, 2)[1] == 2 * 30 + 10 + 12


def test_fusion_bytes_matches_the_reference_on_random_chains():
    rng = np.random.default_rng(0)
    for _ in range(50):
        chain = tuple(rng.choice(list(ref.OPS), rng.integers(1, 7)))
        m, n, itemsize = int(rng.integers(1, 5000)), int(rng.integers(1, 5000)), int(rng.choice([2, 4]))
        assert s.fusion_bytes(chain, m, n, itemsize) == ref.fusion_bytes(chain, m, n, itemsize)


def test_fusion_bytes_names_an_unknown_op():
    with pytest.raises(ValueError, match="unknown ops"):
        s.fusion_bytes(("bias", "softmax"), 4, 4, 2)


# ---------------------------------------------------------------- day 2: the activation kernels against PyTorch
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_bias_gelu_and_its_backward_match_pytorch(approximate):
    x, bias, dy = _randn(2, 3, 129), _randn(129, seed=1), _randn(2, 3, 129, seed=2, scale=1.0)
    xd, bd = x.double().requires_grad_(), bias.double().requires_grad_()
    y = F.gelu(xd + bd, approximate=approximate)
    y.backward(dy.double())
    _close(s.bias_gelu(x, bias, approximate), y.detach(), 1e-5, 1e-6)
    dx, dbias = s.bias_gelu_backward(x, bias, dy, approximate)
    _close(dx, xd.grad, 1e-5, 1e-6, "dx")
    _close(dbias, bd.grad, 1e-5, 1e-5, "dbias")


def test_bias_gelu_backward_is_deterministic():
    """dbias is summed in a fixed order (partial rows, then across them): the same bits on every run."""
    x, bias, dy = _randn(1000, 9), _randn(9, seed=1), _randn(1000, 9, seed=2)
    first = s.bias_gelu_backward(x, bias, dy)[1]
    assert torch.equal(first, s.bias_gelu_backward(x, bias, dy)[1])


def _glu_reference(act, gate, up, dy):
    """(y, dgate, dup) of act(gate)·up by float64 autograd (dup None without up)."""
    g = gate.double().requires_grad_()
    u = up.double().requires_grad_() if up is not None else None
    y = act(g) * u if u is not None else act(g)
    y.backward(dy.double())
    return y.detach(), g.grad, u.grad if u is not None else None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_swiglu_geglu_forward_and_backward_match_pytorch(dtype):
    """(5, 37): one partial block; float16 judged at its rounding of the result."""
    rtol, atol = (1e-5, 1e-6) if dtype == torch.float32 else (2e-3, 1e-4)
    gate, up, dy = _randn(5, 37, dtype=dtype), _randn(5, 37, dtype=dtype, seed=1), _randn(5, 37, dtype=dtype, seed=2)
    y, dgate, _ = _glu_reference(F.silu, gate, None, dy)
    _close(s.silu(gate), y, rtol, atol, "silu")
    _close(s.silu_backward(gate, dy), dgate, rtol, atol, "silu_backward")
    y, dgate, dup = _glu_reference(F.silu, gate, up, dy)
    _close(s.swiglu(gate, up), y, rtol, atol, "swiglu")
    for got, want, name in zip(s.swiglu_backward(gate, up, dy), (dgate, dup), ("dgate", "dup")):
        _close(got, want, rtol, atol, f"swiglu_backward {name}")
    for approximate in APPROXIMATIONS:
        y, dgate, dup = _glu_reference(lambda t: F.gelu(t, approximate=approximate), gate, up, dy)
        _close(s.geglu(gate, up, approximate), y, rtol, atol, f"geglu {approximate}")
        for got, want, name in zip(s.geglu_backward(gate, up, dy, approximate), (dgate, dup), ("dgate", "dup")):
            _close(got, want, rtol, atol, f"geglu_backward {approximate} {name}")


def test_activations_saturate_without_nan():
    z = torch.tensor([-1e4, -88.0, -20.0, -1e-30, 0.0, 1e-30, 20.0, 88.0, 1e4], device=DEVICE)
    zero = torch.zeros_like(z)
    for approximate in APPROXIMATIONS:
        _close(s.bias_gelu(z, zero, approximate), F.gelu(z.double(), approximate=approximate), 1e-6, 1e-30)
        assert torch.isfinite(s.bias_gelu_backward(z, zero, torch.ones_like(z), approximate)[0]).all()
    _close(s.silu(z), F.silu(z.double()), 1e-6, 1e-30)
    assert torch.isfinite(s.silu_backward(z, torch.ones_like(z))).all()


# ---------------------------------------------------------------- autograd Functions
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_bias_gelu_function_trains_like_pytorch(approximate):
    """The kernels compute in float32, so the gradients are checked against float64 autograd of the composed ops."""
    x, bias = _randn(7, 45).requires_grad_(), _randn(45, seed=1).requires_grad_()
    dy = _randn(7, 45, seed=2)
    s.BiasGelu.apply(x, bias, approximate).backward(dy)
    xd, bd = x.detach().double().requires_grad_(), bias.detach().double().requires_grad_()
    F.gelu(xd + bd, approximate=approximate).backward(dy.double())
    _close(x.grad, xd.grad, 1e-5, 1e-6, "dx")
    _close(bias.grad, bd.grad, 1e-5, 1e-5, "dbias")


def test_swiglu_function_trains_like_pytorch():
    gate, up = _randn(6, 33).requires_grad_(), _randn(6, 33, seed=1).requires_grad_()
    dy = _randn(6, 33, seed=2)
    s.SwiGLU.apply(gate, up).backward(dy)
    _, dgate, dup = _glu_reference(F.silu, gate.detach(), up.detach(), dy)
    _close(gate.grad, dgate, 1e-5, 1e-6, "dgate")
    _close(up.grad, dup, 1e-5, 1e-6, "dup")


def test_the_gradient_comparison_catches_a_wrong_backward(monkeypatch):
    """The comparison above can fail: with dbias scaled by 1.01 it does."""
    real = s.bias_gelu_backward
    monkeypatch.setattr(s, "bias_gelu_backward", lambda *a: (real(*a)[0], real(*a)[1] * 1.01))
    with pytest.raises(AssertionError, match="dbias"):
        test_bias_gelu_function_trains_like_pytorch("none")


# ---------------------------------------------------------------- CUDA C and the GEMM epilogue
def test_cuda_bias_gelu_compiles_for_every_dtype_without_spills():
    reports = s.cuda_bias_gelu_kernel.report()
    assert {r.kernel.split("<")[1].rstrip(">") for r in reports} == set(cuda.CUDA_TYPES.values())
    for r in reports:
        assert 0 < r.registers <= 64 and r.spill_bytes == 0, r


@pytest.mark.skipif(cuda.ON_GPU, reason="checks the behaviour without a GPU")
def test_cuda_bias_gelu_without_a_gpu_is_a_one_line_skip_reason():
    with pytest.raises(cuda.NeedsGPU, match="needs a GPU"):
        s.cuda_bias_gelu(torch.zeros(2, 8), torch.zeros(8))


@pytest.mark.skipif(not cuda.ON_GPU, reason="a CuPy kernel runs on a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_bias_gelu_matches_pytorch(dtype):
    unit = {torch.float32: 1e-6, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}[dtype]
    x, bias = _randn(37, 300, dtype=dtype), _randn(300, dtype=dtype, seed=1)
    for approximate in APPROXIMATIONS:
        want = F.gelu(x.double() + bias.double(), approximate=approximate)
        _close(s.cuda_bias_gelu(x, bias, approximate), want, 2 * unit, 1e-5, approximate)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matmul_bias_gelu_matches_the_composed_ops(dtype):
    """(37, 45) @ (45, 70), w given as a Linear's weight.t() (not contiguous): partial tiles on every side. float32
    multiplies in full float32 ("ieee"); float16 is judged at its rounding of the result."""
    a, weight, bias = _randn(37, 45, dtype=dtype), _randn(70, 45, dtype=dtype, seed=1, scale=0.3), _randn(70, dtype=dtype)
    rtol, atol = (1e-5, 1e-5) if dtype == torch.float32 else (2e-3, 1e-3)
    for approximate in APPROXIMATIONS:
        want = F.gelu(a.double() @ weight.double().t() + bias.double(), approximate=approximate)
        _close(s.matmul_bias_gelu(a, weight.t(), bias, approximate), want, rtol, atol, approximate)


# ---------------------------------------------------------------- the launchers' errors
def test_launchers_explain_bad_arguments():
    x = _randn(4, 6)
    with pytest.raises(ValueError, match="bias must be"):
        s.bias_gelu(x, _randn(5))
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        s.bias_gelu(x.double(), _randn(6).double())
    with pytest.raises(ValueError, match="approximate must be one of"):
        s.bias_gelu(x, _randn(6), "fast")
    with pytest.raises(ValueError, match="dy must be"):
        s.bias_gelu_backward(x, _randn(6), x[:2])
    with pytest.raises(ValueError, match="x must be contiguous"):
        s.bias_gelu(x.t(), _randn(4))
    with pytest.raises(ValueError, match="up must be"):
        s.swiglu(x, x[:, :3])
    with pytest.raises(ValueError, match=r"need a \(M, K\) and w \(K, N\)"):
        s.matmul_bias_gelu(_randn(3, 4), _randn(5, 6), _randn(6))
