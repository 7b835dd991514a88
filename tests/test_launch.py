"""course.launch: the lean launch computes what kernel[grid] computes, and on a GPU names the same compiled binary
Triton would pick, however the arguments are aligned or sized."""
import pytest
import torch
import triton
import triton.language as tl

from course.backend import DEVICE, ON_GPU
from course.launch import hooked, launch


@triton.jit
def _scaled_copy(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr, SHIFT: tl.constexpr = 0.0):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * scale + SHIFT, mask=offs < n)


def _run(x, y, n, scale, **meta):
    return launch(_scaled_copy, (triton.cdiv(n, meta["BLOCK"]),), x, y, n, scale, **meta)


@pytest.mark.parametrize("n", [1, 16, 17, 1000])
def test_the_result_is_kernel_grid_s(n):
    x = torch.randn(n + 3, device=DEVICE)
    for _ in range(3):  # the first call fills the cache, the later ones take the short path on a GPU
        y = torch.full_like(x, float("nan"))
        _run(x, y, n, 2.0, BLOCK=64, SHIFT=1.0)
        assert torch.equal(y[:n], x[:n] * 2.0 + 1.0) and y[n:].isnan().all()


@pytest.mark.skipif(not ON_GPU, reason="off a GPU launch() is kernel[grid] itself")
def test_every_specialisation_gets_the_binary_triton_picks():
    base = torch.randn(4096, device="cuda")
    out = torch.empty_like(base)
    for dtype in (torch.float32, torch.bfloat16):
        for offset in (0, 1, 4, 8):  # 16-byte aligned or not
            for n in (1, 16, 33):      # 1, a multiple of 16, neither
                x, y = base.to(dtype)[offset:], out.to(dtype)[offset:]
                picked = _scaled_copy[(1,)](x, y, n, 0.5, BLOCK=128)
                _run(x, y, n, 0.5, BLOCK=128)
                assert _run(x, y, n, 0.5, BLOCK=128) is picked, (dtype, offset, n)
                assert picked in [hit for hit, _ in _scaled_copy.__dict__["_course_launches"].values()]
                assert torch.equal(y[:n], (x[:n].float() * 0.5).to(dtype))


def test_a_launch_hook_is_seen_only_when_one_is_set():
    # Triton's hooks live in a chain that is never None: an empty chain must not send every launch the slow way.
    from triton import knobs
    assert not hooked()
    probe = lambda *args, **kwargs: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(probe)
    try:
        assert hooked()
    finally:
        knobs.runtime.launch_enter_hook.remove(probe)
    assert not hooked()
