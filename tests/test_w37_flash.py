"""Week 37's Triton FlashAttention forward against the float64 reference: odd sizes, M != N, causal,
the log-sum-exp. Runs in the interpreter on CPU (fp32, fp16) and on a GPU (bf16 too)."""
import numpy as np
import pytest
import torch

from course import backend
from course.w35_attention_blocks import reference as ref
from solutions import w37_flash_attention_core as s

SHAPES = [(1, 1, 1, 1, 16), (2, 3, 37, 37, 64), (1, 2, 45, 70, 16), (1, 2, 70, 45, 32), (1, 1, 33, 33, 100)]
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if backend.ON_GPU else [])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flash_attention_matches_the_reference(shape, causal, dtype):
    b, h, m, n, d = shape
    g = torch.Generator().manual_seed(m * n + d)
    q, k, v = (torch.randn(b, h, rows, d, generator=g).to(backend.DEVICE, dtype) for rows in (m, n, n))
    o, lse = s.flash_attention(q, k, v, causal=causal)
    q64, k64, v64 = (t.double().cpu().numpy() for t in (q, k, v))
    unit = {torch.float32: 1e-5, torch.float16: 2.0 ** -9, torch.bfloat16: 2.0 ** -6}[dtype]  # P is rounded to the dtype
    np.testing.assert_allclose(o.double().cpu().numpy(), ref.attention(q64, k64, v64, causal=causal), atol=4 * unit, rtol=0)
    np.testing.assert_allclose(lse.double().cpu().numpy(), ref.log_sum_exp(q64, k64, causal=causal), atol=1e-4, rtol=0)


def test_arguments_are_checked():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="share"):
        s.flash_attention(q, torch.randn(1, 2, 8, 32), torch.randn(1, 2, 8, 32))
    with pytest.raises(ValueError, match="share"):
        s.flash_attention(q, q, q.half())


def test_tile_schedule_by_hand():
    from course.w37_flash_attention_core import schedule
    # N = 200, blocks 64 × 64: three whole key blocks and a partial one
    full = schedule.tile_schedule(130, 200, 64, 64)
    assert full.shape == (3, 4) and (full[:, :3] == schedule.UNMASKED).all() and (full[:, 3] == schedule.MASKED).all()
    # causal, 128 × 64 blocks, N = 256: program 0 needs keys 0..127 (two masked blocks), program 1 keys
    # 0..255: blocks 0-1 whole and unmasked, 2-3 on its diagonal
    causal = schedule.tile_schedule(256, 256, 128, 64, causal=True)
    assert causal.tolist() == [[2, 2, 0, 0], [1, 1, 2, 2]]
    # the computed tiles are the keys the cost model counts: 128 + 256 per head
    from course import attention_cost as cost
    keys = int((causal != schedule.SKIPPED).sum()) * 64
    assert keys == 384
    assert cost.flash_attention_cost(1, 256, 256, 8, 2, 128, causal=True)["bytes"] == (2 * 256 * 8 + 2 * keys * 8) * 2 + 4 * 256


def test_the_schedule_plots():
    import matplotlib
    matplotlib.use("Agg")
    from course.w37_flash_attention_core import schedule
    ax = schedule.plot_schedule(300, 300, 64, 32, causal=True)
    assert "skipped" in ax.get_title()
