"""online_softmax's split path (GPU only): its counter buffers are recycled between launches."""
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
