"""Week 39, days 3-4: Philox dropout and its fusions, beyond what the graders check.

The NumPy Philox against the Random123 known answers and against Triton's own tl.rand4x, bit for bit; the dropout mask's
statistics (keep rate, independence across neighbours, rows, offsets and seeds) and reproducibility; p = 0 exactly
x + residual; the launchers' errors; the RMSNorm flavour; the fused backward of dropout + residual + LayerNorm and its
autograd.Function against torch autograd of the composition with the same mask. Runs on CPU (interpreter) or GPU."""
import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from course import DEVICE
from course.w34_layernorm import reference as norm_ref
from course.w39_kernel_fusion import reference as ref
from solutions import w39_kernel_fusion as s

SEEDS = (0, 1, 2 ** 31 - 1, 2 ** 32 + 7, 2 ** 62 + 11)                # the key's high word 0 and not
OFFSETS = (0, 5, 2 ** 33 - 1000, 2 ** 34 - 500, 2 ** 34 - 999, 2 ** 42 + 3)  # counters (draw // 4) crossing 2^31, 2^32
SIGMAS = 5  # statistical bounds at 5 standard deviations: a false alarm about once in 3.5 million runs


@triton.jit
def _draws_kernel(out_ptr, n, seed, offset, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    # One program per BLOCK draws: out[i] = draw offset + i of the course's stream (philox_draws).
    start = tl.program_id(0).to(tl.int64) * BLOCK
    i = start + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, s.philox_draws(seed, offset + start, BLOCK, ALIGNED), mask=i < n)


@triton.jit
def _rand4x_kernel(out_ptr, n, seed, first, BLOCK: tl.constexpr):
    # Triton's own generator, no course code: out[4k + w] = word w of tl.rand4x(seed, first + k).
    k = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    u0, u1, u2, u3 = tl.rand4x(seed, first + k)
    tl.store(out_ptr + 4 * k, u0, mask=4 * k < n)
    tl.store(out_ptr + 4 * k + 1, u1, mask=4 * k + 1 < n)
    tl.store(out_ptr + 4 * k + 2, u2, mask=4 * k + 2 < n)
    tl.store(out_ptr + 4 * k + 3, u3, mask=4 * k + 3 < n)


def _triton_draws(seed: int, offset: int, n: int, aligned: bool) -> np.ndarray:
    out = torch.empty(n, dtype=torch.float32, device=DEVICE)
    _draws_kernel[(triton.cdiv(n, 1024),)](out, n, seed, offset, BLOCK=1024, ALIGNED=aligned)
    return out.cpu().numpy()


def _rand4x(seed: int, first: int, n: int) -> np.ndarray:
    out = torch.empty(n, dtype=torch.float32, device=DEVICE)
    _rand4x_kernel[(triton.cdiv(n, 4 * 256),)](out, n, seed, first, BLOCK=256)
    return out.cpu().numpy()


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _mask(shape, p: float, seed: int, offset: int = 0) -> np.ndarray:
    """The kernel's own mask: dropout of ones with a zero residual is 1 / (1 - p) where kept, 0 where dropped."""
    ones = torch.ones(shape, device=DEVICE)
    return s.dropout_residual_forward(ones, torch.zeros_like(ones), p, seed, offset).cpu().numpy() != 0


def _data(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, r, dy, dh = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(4))
    w = 1 + 0.5 * torch.randn(shape[-1], generator=g, dtype=torch.float64)
    b = 0.5 * torch.randn(shape[-1], generator=g, dtype=torch.float64)
    return [t.to(device=DEVICE, dtype=dtype) for t in (x, r, w, b, dy, dh)]


def _np(*tensors):
    return [t.double().cpu().numpy() for t in tensors]


# ---------------------------------------------------------------- the reference RNG
def test_philox_matches_the_random123_known_answers():
    """Philox4x32-10 known-answer vectors of Random123, the reference implementation of Salmon et al., "Parallel
    Random Numbers: As Easy as 1, 2, 3" (SC 2011): counter words, key words, the four output words."""
    vectors = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
               ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
               ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
                (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for counter, key, expected in vectors:
        words = ref.philox4x32(tuple(np.array([c], dtype=np.uint64) for c in counter), key)
        assert tuple(int(w[0]) for w in words) == expected


@pytest.mark.parametrize("seed", SEEDS)
def test_philox_uniform_is_tl_rand4x_bit_for_bit(seed):
    """Draw g is word g % 4 of Triton's tl.rand4x(seed, g // 4): the reference against Triton's generator itself,
    and the kernels' philox_draws (both paths: blocks starting at a multiple of 4, and anywhere) against the
    reference, three blocks of draws from offsets whose counters cross 2^31 and 2^32."""
    n = 2100
    for offset in OFFSETS:
        expected = _bits(ref.philox_uniform(seed, np.uint64(offset) + np.arange(n, dtype=np.uint64)))
        aligned = offset - offset % 4
        assert np.array_equal(_bits(_rand4x(seed, aligned // 4, n)),
                              _bits(ref.philox_uniform(seed, np.uint64(aligned) + np.arange(n, dtype=np.uint64))))
        assert np.array_equal(_bits(_triton_draws(seed, offset, n, aligned=False)), expected), (seed, offset)
        if offset % 4 == 0:
            assert np.array_equal(_bits(_triton_draws(seed, offset, n, aligned=True)), expected), (seed, offset)


def test_philox_uniform_lies_in_the_unit_interval_and_is_uniform():
    """float32 in [0, 1), including at the extreme words (0 and 2^31 − 1 fold to the two ends); mean and variance
    of 2^18 draws within 5 σ of U(0, 1)'s 1/2 and 1/12."""
    n = 2 ** 18
    u = ref.philox_uniform(12345, np.arange(n, dtype=np.uint64)).astype(np.float64)
    assert ref.philox_uniform(0, [0]).dtype == np.float32
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) <= SIGMAS * math.sqrt(1 / 12 / n)
    assert abs(u.var() - 1 / 12) <= SIGMAS * math.sqrt(1 / 180 / n)  # Var[(u − 1/2)²] = 1/80 − 1/144 = 1/180
    top = np.float32(0x7FFFFFFF) * ref.UNIFORM_SCALE
    assert top < 1.0 and np.float32(0) * ref.UNIFORM_SCALE == 0.0
    with pytest.raises(ValueError, match="seed must be in"):
        ref.philox_uniform(-1, [0])


# ---------------------------------------------------------------- the mask's statistics
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_keep_rate_is_within_a_binomial_bound(p):
    n = 2 ** 16
    kept = _mask((16, n // 16), p, seed=2024, offset=7).sum()
    assert abs(kept / n - (1 - p)) <= SIGMAS * math.sqrt(p * (1 - p) / n), kept / n


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.ravel().astype(np.float64), b.ravel().astype(np.float64))[0, 1])


def test_masks_of_neighbours_rows_offsets_and_seeds_are_uncorrelated():
    """Pearson correlation within 5 / sqrt(n) (its standard deviation is 1 / sqrt(n) for independent masks):
    neighbouring elements, neighbouring rows, the same elements at two offsets, and two seeds."""
    rows, cols, p = 64, 512, 0.5
    mask = _mask((rows, cols), p, seed=99, offset=1000)
    bound = lambda n: SIGMAS / math.sqrt(n)  # noqa: E731
    assert abs(_correlation(mask.ravel()[:-1], mask.ravel()[1:])) <= bound(mask.size - 1)
    assert abs(_correlation(mask[:-1], mask[1:])) <= bound(mask[1:].size)
    other_offset = _mask((rows, cols), p, seed=99, offset=1000 + 3 * rows * cols)
    assert abs(_correlation(mask, other_offset)) <= bound(mask.size)
    other_seed = _mask((rows, cols), p, seed=100, offset=1000)
    assert abs(_correlation(mask, other_seed)) <= bound(mask.size)


def test_a_mask_is_reproducible_and_set_by_seed_and_offset_alone():
    """Same (seed, offset): the same mask, bit for bit, whatever the shape it is drawn for (only the flat index
    counts). Another seed or offset: another mask. Shifting the offset by k shifts the mask by k elements."""
    seed, offset, p = 2 ** 33 + 5, 77, 0.5
    first = _mask((12, 100), p, seed, offset)
    assert np.array_equal(first, _mask((12, 100), p, seed, offset))
    assert np.array_equal(first.ravel(), _mask((3, 4, 100), p, seed, offset).ravel())
    assert not np.array_equal(first, _mask((12, 100), p, seed + 1, offset))
    assert not np.array_equal(first, _mask((12, 100), p, seed, offset + 1))
    assert np.array_equal(first.ravel()[10:], _mask((1190,), p, seed, offset + 10))
    assert np.array_equal(first, ref.dropout_keep((12, 100), p, seed, offset))


# ---------------------------------------------------------------- dropout + residual
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_p_zero_is_exactly_x_plus_residual(dtype):
    x, r, _, _, dy, _ = _data((7, 333), dtype)
    y, dx = s.dropout_residual(x, r, dy, 0.0, seed=5, offset=11)
    assert torch.equal(y, x + r)
    assert torch.equal(dx, dy)


def test_the_backward_regenerates_the_forward_mask():
    """dx for upstream dy is dropout(dy) with the forward's (seed, offset): the forward of dy with a zero residual,
    bit for bit; and from another offset it is not."""
    x, r, _, _, dy, _ = _data((9, 1001))
    seed, offset, p = 31337, 2 ** 31 - 4000, 0.3
    y, dx = s.dropout_residual(x, r, dy, p, seed, offset)
    assert torch.equal(dx, s.dropout_residual_forward(dy, torch.zeros_like(dy), p, seed, offset))
    assert not torch.equal(dx, s.dropout_residual_backward(dy, p, seed, offset + 1))
    want_y, want_dx = ref.dropout_residual(*_np(x, r, dy), p, seed, offset)
    np.testing.assert_allclose(y.cpu().numpy(), want_y, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dx.cpu().numpy(), want_dx, rtol=1e-6, atol=1e-6)


def test_launchers_explain_bad_arguments():
    x, r, w, b, dy, _ = _data((4, 8))
    for p in (1.0, -0.1, float("nan"), 1.5):
        with pytest.raises(ValueError, match=r"p, the probability of dropping an element, must be in \[0, 1\)"):
            s.dropout_residual_forward(x, r, p, seed=0)
    for seed in (-1, 2 ** 63, 1.5, True):
        with pytest.raises(ValueError, match="seed must be an integer"):
            s.dropout_residual_forward(x, r, 0.1, seed=seed)
    with pytest.raises(ValueError, match="offset must be an integer"):
        s.dropout_residual_backward(dy, 0.1, seed=0, offset=-3)
    with pytest.raises(ValueError, match="residual must be a torch.float32 tensor of shape"):
        s.dropout_residual_forward(x, r[:2], 0.1, seed=0)
    with pytest.raises(ValueError, match="residual must be a torch.float32 tensor"):
        s.dropout_residual_forward(x, r.half(), 0.1, seed=0)
    with pytest.raises(ValueError, match="x must be float16, bfloat16 or float32"):
        s.dropout_residual_forward(x.double(), r.double(), 0.1, seed=0)
    with pytest.raises(ValueError, match="x must be contiguous"):
        s.dropout_residual_forward(x.t(), r.t(), 0.1, seed=0)
    with pytest.raises(ValueError, match="residual must be contiguous"):
        s.dropout_residual_forward(x, r.t().contiguous().t(), 0.1, seed=0)
    with pytest.raises(ValueError, match="weight must be a torch.float32 vector of length 8"):
        s.dropout_residual_layernorm(x, r, w[:4], b, 0.1, seed=0)
    with pytest.raises(ValueError, match="do not fit one block"):
        big = torch.zeros(1, s.NORM_MAX_COLS + 1, device=DEVICE)
        s.dropout_residual_rmsnorm(big, big, big[0], 0.1, seed=0)


# ---------------------------------------------------------------- dropout + residual + norm
def test_the_rmsnorm_flavour_matches_the_reference():
    x, r, w, _, _, _ = _data((5, 77))
    p, seed, offset = 0.2, 2 ** 40, 123
    y, h, rstd = s.dropout_residual_rmsnorm(x, r, w, p, seed, offset)
    xd, rd, wd = _np(x, r, w)
    want_h = rd + ref.dropout(xd, ref.dropout_keep(xd.shape, p, seed, offset), p)
    want_y, want_rstd = norm_ref.rmsnorm(want_h, wd)
    for got, want in ((h, want_h), (y, want_y), (rstd, want_rstd)):
        np.testing.assert_allclose(got.double().cpu().numpy(), want, rtol=1e-5, atol=1e-5)
    _, h_ln, _, _ = s.dropout_residual_layernorm(x, r, w, torch.zeros_like(w), p, seed, offset)
    assert torch.equal(h, h_ln)  # the same mask in both flavours


def _composition(x, r, w, b, p, seed, offset, eps=s.NORM_EPS):
    """h = r + dropout(x) and y = layer_norm(h) in PyTorch, with the kernel's mask (from the reference Philox)."""
    keep = torch.from_numpy(ref.dropout_keep(tuple(x.shape), p, seed, offset)).to(x.device)
    h = r + torch.where(keep, x / (1 - p), torch.zeros_like(x))
    return torch.nn.functional.layer_norm(h, (x.shape[-1],), w, b, eps), h


@pytest.mark.parametrize("shape,with_dh", [((5, 33), False), ((2, 3, 129), True), ((7, 300), True)])
def test_fused_backward_matches_torch_autograd_of_the_composition(shape, with_dh):
    """dx, dresidual, dweight, dbias of the fused backward (mask drawn again, statistics saved by the forward)
    against torch autograd of the same composition, for gradients of y and (with_dh) of h."""
    x, r, w, b, dy, dh = _data(shape)
    p, seed, offset = 0.3, 2 ** 35 + 1, 4321
    y, h, mean, rstd = s.dropout_residual_layernorm(x, r, w, b, p, seed, offset)
    grads = s.dropout_residual_layernorm_backward(dy, h, w, mean, rstd, p, seed, offset, dh=dh if with_dh else None)
    leaves = [t.clone().requires_grad_() for t in (x, r, w, b)]
    want_y, want_h = _composition(*leaves, p, seed, offset)
    ((want_y * dy).sum() + ((want_h * dh).sum() if with_dh else 0)).backward()
    torch.testing.assert_close(y, want_y.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, want_h.detach(), rtol=1e-6, atol=1e-6)
    for got, leaf, name in zip(grads, leaves, ("dx", "dresidual", "dweight", "dbias")):
        torch.testing.assert_close(got, leaf.grad, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


def test_the_autograd_function_matches_torch_and_needs_the_same_mask():
    x, r, w, b, dy, dh = _data((6, 45))
    p, seed, offset = 0.25, 77, 2 ** 31 - 100
    ours = [t.clone().requires_grad_() for t in (x, r, w, b)]
    y, h = s.DropoutResidualLayerNorm.apply(*ours, p, seed, offset, s.NORM_EPS)
    ((y * dy).sum() + (h * dh).sum()).backward()
    theirs = [t.clone().requires_grad_() for t in (x, r, w, b)]
    want_y, want_h = _composition(*theirs, p, seed, offset)
    ((want_y * dy).sum() + (want_h * dh).sum()).backward()
    for a, e in zip(ours, theirs):
        torch.testing.assert_close(a.grad, e.grad, rtol=1e-4, atol=1e-4)
    # the comparison can fail: torch's composition with the mask of the next offset disagrees
    shifted = [t.clone().requires_grad_() for t in (x, r, w, b)]
    other_y, other_h = _composition(*shifted, p, seed, offset + 1)
    ((other_y * dy).sum() + (other_h * dh).sum()).backward()
    assert not torch.allclose(ours[0].grad, shifted[0].grad, rtol=1e-4, atol=1e-4)


def test_byte_model_of_the_fusion():
    """Fused: x, residual read, h, y written (4MN elements). Unfused: 7MN elements and a one-byte mask."""
    assert ref.dropout_residual_norm_bytes(4, 1024, 2, fused=True) == 4 * 4 * 1024 * 2
    assert ref.dropout_residual_norm_bytes(4, 1024, 2, fused=False) == 7 * 4 * 1024 * 2 + 4 * 1024


def test_the_compile_for_hopper_sees_the_alignment_a_launch_gives():
    """course.triton_ptx compiles as the launcher does: with 16-aligned pointers and a 16-multiple length the
    dropout kernel moves 16 bytes per load and store; told nothing, one element at a time."""
    from course.triton_ptx import hopper_ptx, hopper_resources, hopper_sass
    types = {"x_ptr": "*bf16", "r_ptr": "*bf16", "y_ptr": "*bf16", "p": "fp32"}
    try:
        wide = hopper_sass(hopper_ptx("w39_kernel_fusion", "dropout_residual_kernel", types, {"BLOCK": 1024},
                                      aligned=["x_ptr", "r_ptr", "y_ptr", "n_elements"]))
        narrow = hopper_ptx("w39_kernel_fusion", "dropout_residual_kernel", types, {"BLOCK": 1024}, aligned=[])
    except RuntimeError as exc:  # a Triton without the sm_90 toolchain
        pytest.skip(str(exc))
    assert {op for op in wide if op.startswith(("LDG", "STG"))} == {"LDG.E.128", "STG.E.128"}
    assert "ld.global.b16" in narrow and "ld.global.v4" not in narrow
    report = hopper_resources(narrow)
    assert 0 < report["registers"] <= 255 and report["spill stores"] == 0
