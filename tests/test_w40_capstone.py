"""Week 40's capstone block: forward against the float64 reference, backward against PyTorch's float64 autograd of
the same block, dropout reproducible from its seed, the benchmark's stages matching the cost model, and the
roofline reference on hand-checked numbers."""
import numpy as np
import pytest
import torch

import course
from course.w35_attention_blocks import reference as ref35
from course.w40_advanced_fusion import reference as ref

k40 = course.kernels("w40_advanced_fusion")
B, N, C, HEADS, FFN = 1, 24, 64, 2, 80


def weights(rng):
    return [rng.normal(1, 0.2, C), rng.normal(0, C ** -0.5, (3 * C, C)), rng.normal(0, C ** -0.5, (C, C)),
            rng.normal(1, 0.2, C), rng.normal(0, C ** -0.5, (2 * FFN, C)), rng.normal(0, FFN ** -0.5, (C, FFN))]


def test_the_block_matches_the_reference_forward_and_backward():
    rng = np.random.default_rng(0)
    arrays = [rng.normal(0, 1, (B, N, C)), *weights(rng)]
    ours = [torch.tensor(a, dtype=torch.float32, device=course.DEVICE, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = k40.capstone_block(*ours, n_heads=HEADS)
    np.testing.assert_allclose(out.detach().cpu().double().numpy(),
                               ref.capstone_block(*arrays, n_heads=HEADS)[0], atol=2e-5, rtol=2e-5)
    dy = rng.normal(0, 1, (B, N, C))
    out.backward(torch.tensor(dy, dtype=torch.float32, device=course.DEVICE))
    cos, sin = (torch.tensor(t) for t in ref35.rope_tables(N, C // HEADS))
    ref.torch_block(*theirs, HEADS, cos, sin).backward(torch.tensor(dy))
    for mine, expected in zip(ours, theirs):
        scale = expected.grad.abs().max().item()
        assert (mine.grad.cpu().double() - expected.grad).abs().max().item() <= 1e-4 * scale


def test_dropout_is_reproducible_from_its_seed_and_active():
    rng = np.random.default_rng(1)
    args = [torch.tensor(a, dtype=torch.float32, device=course.DEVICE) for a in (rng.normal(0, 1, (B, N, C)),
                                                                                   *weights(rng))]
    first, again = (k40.capstone_block(*args, HEADS, 0.3, 7) for _ in range(2))
    assert torch.equal(first, again)
    assert not torch.allclose(first, k40.capstone_block(*args, HEADS, 0.3, 8))
    assert not torch.allclose(first, k40.capstone_block(*args, HEADS, 0.0, 7))


def test_the_benchmarked_stages_are_the_cost_models():
    rng = np.random.default_rng(2)
    args = [torch.tensor(a, dtype=torch.float32, device=course.DEVICE) for a in (rng.normal(0, 1, (B, N, C)),
                                                                                   *weights(rng))]
    stages = k40.capstone_stages(*args, HEADS, 0.1, 3)
    assert set(stages) == set(ref.capstone_stage_costs(B, N, C, FFN, HEADS))
    for run in stages.values():
        run()


def test_roofline_reference_on_numbers_checked_by_hand():
    # 1 GFLOP over 1 MB (intensity 1000) in 2 ms on a 500 TFLOP/s, 2000 GB/s GPU: compute-bound (ridge 250),
    # attainable 500, achieved 0.5 TFLOP/s, least time 2 µs → share 0.001
    intensity, attainable, achieved, share, bound = ref.roofline_bound([1e9], [1e6], [2.0], 500.0, 2000.0)
    assert (intensity[0], attainable[0], bound[0]) == (1000.0, 500.0, 1.0)
    assert achieved[0] == pytest.approx(0.5) and share[0] == pytest.approx(1e-3)
    # bytes only: 1 GB in 1 ms at 2000 GB/s: half the bandwidth
    assert ref.roofline_bound([0.0], [1e9], [1.0], 500.0, 2000.0)[3][0] == pytest.approx(0.5)
