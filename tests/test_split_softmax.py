"""online_softmax's split path (GPU only): its counters are clean for every launch, eager or replayed in a graph."""
import pytest
import torch

from course.backend import ON_GPU
from solutions.w33_softmax import SPLIT_MIN_COLS, online_softmax


@pytest.mark.skipif(not ON_GPU, reason="the split kernel spins on other programs: it only runs on a GPU")
def test_counters_are_clean_for_every_launch_whatever_the_row_count():
    # Row counts go up and down, so a launch finds counters that a larger or smaller launch used.
    for rows in (300, 5, 1024, 7, 300, 2048, 1):
        for _ in range(3):
            x = torch.randn(rows, 4 * SPLIT_MIN_COLS + 123, device="cuda") * 4
            error = (online_softmax(x) - torch.softmax(x, -1)).abs().max().item()
            assert error < 1e-5, (rows, error)


@pytest.mark.skipif(not ON_GPU, reason="the split kernel spins on other programs: it only runs on a GPU")
def test_a_cuda_graph_replays_the_split_kernel_with_clean_counters():
    x = torch.randn(64, 4 * SPLIT_MIN_COLS + 5, device="cuda") * 4
    out = torch.empty_like(x)
    online_softmax(x, out)  # compiles, and allocates the counters outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        online_softmax(x, out)
    for _ in range(5):
        x.copy_(torch.randn_like(x) * 4)
        out.fill_(float("nan"))
        graph.replay()
        assert (out - torch.softmax(x, -1)).abs().max().item() < 1e-5
