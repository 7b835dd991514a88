"""CUDA C: compiled with NVRTC without a GPU, with the learner's line numbers and a resource report."""
import pytest
import torch

from course import cuda
from solutions import w33_softmax as sol


@pytest.mark.parametrize("kernel", [sol.block_softmax_kernel, sol.warp_softmax_kernel], ids=lambda k: k.name)
def test_course_kernels_compile_for_every_dtype_without_spills(kernel):
    reports = kernel.report()
    assert {r.kernel.split("<")[1].rstrip(">") for r in reports} == set(cuda.CUDA_TYPES.values())
    for r in reports:
        assert 0 < r.registers <= 128 and r.spill_bytes == 0, r


def test_compile_error_points_at_the_learners_line():
    source = "template <typename T>\n__global__ void broken(const T* x, T* y, int n) {\n    y[0] = nope;\n}\n"
    with pytest.raises(cuda.CudaCompileError, match=r"broken\.cu\(3\).*nope"):
        cuda.compile_report(source, "broken")


@pytest.mark.skipif(cuda.ON_GPU, reason="checks the behaviour without a GPU")
def test_running_without_a_gpu_is_a_one_line_skip_reason():
    with pytest.raises(cuda.NeedsGPU, match="needs a GPU"):
        sol.block_softmax(torch.zeros(2, 8))


def test_unsupported_dtype_is_a_clear_error():
    with pytest.raises(TypeError, match="float64 is not supported"):
        sol.block_softmax(torch.zeros(2, 8, dtype=torch.float64))


def test_occupancy_by_hand():
    # 32 regs x 32 lanes = 1024 per warp; 256 threads = 8 warps = 8192 regs -> 8 blocks; 2048/256 = 8.
    assert cuda.occupancy(32, 1024, 256) == (8, 1.0, "registers and threads")
    # 128 regs: 4096 per warp, 32 warps of 1024 threads = 131072 > 65536 -> 0 blocks fit.
    assert cuda.occupancy(128, 0, 1024)[0] == 0
    # 100 KB of shared memory: (228 KB) // (101 KB) = 2 blocks, the binding limit.
    assert cuda.occupancy(16, 100 * 1024, 64) == (2, 2 * 64 / 2048, "shared memory")
