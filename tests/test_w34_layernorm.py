"""Week 34 kernels without an exercise of their own: the Triton LayerNorm forward, the RMSNorm backward,
the autograd Functions (gradcheck in float64) and the launchers' errors. Runs on CPU (interpreter) or GPU."""
import numpy as np
import pytest
import torch

from course import DEVICE
from course.w34_layernorm import reference as ref
from solutions import w34_layernorm as s


def _data(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    w = 1 + 0.5 * torch.randn(shape[-1], generator=g, dtype=torch.float64)
    b = 0.5 * torch.randn(shape[-1], generator=g, dtype=torch.float64)
    dy = torch.randn(shape, generator=g, dtype=torch.float64)
    return [t.to(device=DEVICE, dtype=dtype) for t in (x, w, b, dy)]


@pytest.mark.parametrize("shape", [(1, 1), (5, 33), (2, 3, 129)])
def test_layernorm_forward_matches_reference(shape):
    x, w, b, _ = _data(shape)
    y, mean, rstd = s.layernorm(x, w, b)
    want = ref.layernorm(*(t.double().cpu().numpy() for t in (x, w, b)))
    for got, expected in zip((y, mean, rstd), want):
        np.testing.assert_allclose(got.double().cpu().numpy(), expected, rtol=1e-5, atol=1e-5)


def test_rmsnorm_backward_matches_reference():
    x, w, _, dy = _data((6, 45))
    _, rstd = s.rmsnorm(x, w)
    dx, dw, db = s.norm_backward(x, w, dy, None, rstd)
    assert db is None
    want = ref.norm_backward(*(t.double().cpu().numpy() for t in (x, w, dy)), centred=False)
    np.testing.assert_allclose(dx.double().cpu().numpy(), want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dw.double().cpu().numpy(), want[1], rtol=1e-4, atol=1e-5)


def test_long_rows_take_their_own_paths_and_match_the_reference():
    """8193 columns: the forward's row loop (layernorm_loop_kernel, 3 programs for 7 rows) and the backward's
    two-halves kernel (LONG_ROW), the second half's tail masked."""
    x, w, b, dy = _data((7, 8193))
    y, mean, rstd = s.layernorm(x, w, b)
    want = ref.layernorm(*(t.double().cpu().numpy() for t in (x, w, b)))
    np.testing.assert_allclose(y.double().cpu().numpy(), want[0], rtol=1e-4, atol=1e-4)
    _, rms_rstd = s.rmsnorm(x, w)
    for centred, mu, st in ((True, mean, rstd), (False, None, rms_rstd)):
        dx, dw, db = s.norm_backward(x, w, dy, mu, st, programs=3)
        want = ref.norm_backward(*(t.double().cpu().numpy() for t in (x, w, dy)), centred=centred)
        for got, expected in zip((dx, dw, db), want):
            if got is not None:
                np.testing.assert_allclose(got.double().cpu().numpy(), expected, rtol=1e-4, atol=1e-4)



@pytest.mark.skipif(DEVICE == "cpu", reason="16-bit kernels on a GPU (the interpreter's bf16 arithmetic is wrong)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_long_odd_rows_in_16_bits_match_the_reference(dtype):
    """Odd widths above 8192 in bf16 and fp16, every kernel: the forward loops, the two-halves backward, the
    fused add. Inputs are rounded to the dtype first, so the error allowed is the output's own rounding
    (float32 arithmetic inside), on the scale of the largest expected value."""
    unit = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[dtype]

    def close(got, expected, what):
        scale = np.abs(expected).max()
        err = np.abs(got.double().cpu().numpy() - expected).max()
        assert err <= 2 * unit * scale, f"{what}: max |error| {err:.3g} > 2·{unit:.3g}·{scale:.3g}"

    for shape in ((7, 8193), (3, 12289)):
        x, w, b, dy = _data(shape, dtype)
        xd, wd, bd, dyd = (t.double().cpu().numpy() for t in (x, w, b, dy))
        y, mean, rstd = s.layernorm(x, w, b)
        close(y, ref.layernorm(xd, wd, bd)[0], f"layernorm {shape}")
        y, rms_rstd = s.rmsnorm(x, w)
        close(y, ref.rmsnorm(xd, wd)[0], f"rmsnorm {shape}")
        for centred, mu, st in ((True, mean, rstd), (False, None, rms_rstd)):
            dx, dw, db = s.norm_backward(x, w, dy, mu, st)
            for got, expected, name in zip((dx, dw, db), ref.norm_backward(xd, wd, dyd, centred=centred),
                                           ("dx", "dw", "db")):
                if got is not None:
                    close(got, expected, f"{name}, centred={centred}, {shape}")
        y, h = s.fused_add_rmsnorm(x, dy, w)
        want_y, want_h = ref.fused_add_rmsnorm(xd, dyd, wd)
        close(h, want_h, f"fused add, h, {shape}")
        close(y, want_y, f"fused add, y, {shape}")

@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_autograd_function_passes_gradcheck_in_float64(norm):
    x, w, b, _ = (t.requires_grad_() for t in _data((3, 7), torch.float64))
    if norm == "layernorm":
        assert torch.autograd.gradcheck(lambda x, w, b: s.LayerNormFunction.apply(x, w, b, 1e-5), (x, w, b))
    else:
        assert torch.autograd.gradcheck(lambda x, w: s.RMSNormFunction.apply(x, w, 1e-5), (x, w))


def test_gradcheck_catches_a_wrong_backward(monkeypatch):
    """The gradcheck above can fail: with dx scaled wrongly it does."""
    x, w, b, _ = (t.requires_grad_() for t in _data((3, 7), torch.float64))
    real = s.norm_backward
    monkeypatch.setattr(s, "norm_backward", lambda *a, **k: tuple(
        g * 1.01 if i == 0 else g for i, g in enumerate(real(*a, **k))))
    assert not torch.autograd.gradcheck(lambda x, w, b: s.LayerNormFunction.apply(x, w, b, 1e-5), (x, w, b),
                                        raise_exception=False)


def test_launchers_explain_bad_arguments():
    x, w, b, _ = _data((4, 8))
    with pytest.raises(ValueError, match="weight and bias must be"):
        s.layernorm(x, w[:4], b)
    with pytest.raises(ValueError, match="do not fit one block"):
        s.rmsnorm(torch.zeros(1, s.MAX_COLS + 1, device=DEVICE), torch.ones(s.MAX_COLS + 1, device=DEVICE))
    with pytest.raises(ValueError, match="residual must be"):
        s.fused_add_rmsnorm(x, x[:2], w)
