"""split_softmax (GPU only): its growing counters serve every launch, eager or replayed in a CUDA graph, whatever
launches of other geometries ran in between; and off a GPU it says why it cannot run."""
import pytest
import torch

from course.backend import ON_GPU
from solutions.w33_softmax import SPLIT_BYTES, split_softmax

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.mark.skipif(not ON_GPU, reason="the split kernel spins on other programs: it only runs on a GPU")
@pytest.mark.parametrize("dtype", DTYPES)
def test_counters_serve_every_launch_whatever_the_row_count(dtype):
    # Row counts go up and down and come back, so a launch finds counters that earlier launches advanced.
    cols = 4 * SPLIT_BYTES // torch.tensor([], dtype=dtype).element_size() + 123
    for rows in (300, 5, 1024, 7, 300, 2048, 1, 5):
        for _ in range(3):
            x = (torch.randn(rows, cols, device="cuda") * 4).to(dtype)
            error = (split_softmax(x).float() - torch.softmax(x.float(), -1)).abs().max().item()
            assert error < (1e-5 if dtype == torch.float32 else 4e-3), (rows, error)


@pytest.mark.skipif(not ON_GPU, reason="the split kernel spins on other programs: it only runs on a GPU")
def test_a_cuda_graph_replays_the_split_kernel_between_eager_launches():
    x = torch.randn(64, 4 * SPLIT_BYTES // 4 + 5, device="cuda") * 4
    out = torch.empty_like(x)
    split_softmax(x, out)  # compiles, and allocates the counters outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        split_softmax(x, out)
    for _ in range(5):
        x.copy_(torch.randn_like(x) * 4)
        out.fill_(float("nan"))
        graph.replay()
        assert (out - torch.softmax(x, -1)).abs().max().item() < 1e-5
        assert (split_softmax(x) - torch.softmax(x, -1)).abs().max().item() < 1e-5  # eager, same counters


@pytest.mark.parametrize("rows", [(1, 5), (3, 70000)])
def test_rows_with_masked_pieces_and_the_cpu_message(rows):
    if not ON_GPU:
        with pytest.raises(RuntimeError, match="only works on a GPU"):
            split_softmax(torch.zeros(rows))
        return
    x = torch.randn(rows, device="cuda") * 4
    x[:, : rows[1] // 2] = float("-inf")  # whole pieces of -inf: they publish the empty state
    assert (split_softmax(x) - torch.softmax(x, -1)).abs().max().item() < 1e-5


@pytest.mark.skipif(not ON_GPU, reason="the split kernel spins on other programs: it only runs on a GPU")
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_that_fit_one_program_and_the_widths_around_a_piece(dtype):
    # Up to SPLIT_BYTES a row is one program without counters; one column more and it is two pieces.
    piece = SPLIT_BYTES // torch.tensor([], dtype=dtype).element_size()
    for cols in (1, 17, 1000, 1024, piece - 1, piece, piece + 1):
        x = (torch.randn(333, cols, device="cuda") * 4).to(dtype)
        out = torch.full_like(x, float("nan"))
        error = (split_softmax(x, out).float() - torch.softmax(x.float(), -1)).abs().max().item()
        assert error < (1e-5 if dtype == torch.float32 else 4e-3), (cols, error)
