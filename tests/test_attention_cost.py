"""course/attention_cost.py against numbers worked out by hand."""
import pytest

from course import attention_cost as cost


def test_kept_keys_by_hand():
    assert cost.kept_keys(4, 6) == 24
    assert cost.kept_keys(4, 4, causal=True) == 1 + 2 + 3 + 4
    assert cost.kept_keys(5, 3, causal=True) == 1 + 2 + 3 + 3 + 3   # rows past the diagonal keep all N
    assert cost.kept_keys(3, 5, causal=True) == 1 + 2 + 3            # top-left: columns past M are never kept


def test_stage_costs_by_hand():
    # one head, M = 2, N = 3, d = 4, bf16: Q 8, K 12, S 6 elements
    assert cost.qk_cost(1, 2, 3, 4, 2) == {"flops": 2 * 2 * 3 * 4, "bytes": (8 + 12 + 6) * 2}
    assert cost.qk_cost(1, 2, 3, 4, 2, score_size=4) == {"flops": 48, "bytes": (8 + 12) * 2 + 6 * 4}
    # softmax: reads 6 kept scores, writes 6 probabilities; causal keeps 1 + 2
    assert cost.softmax_cost(1, 2, 3, 2) == {"flops": 30, "bytes": (6 + 6) * 2}
    assert cost.softmax_cost(1, 2, 3, 2, causal=True) == {"flops": 15, "bytes": (3 + 6) * 2}
    assert cost.softmax_cost(1, 2, 3, 4, out_size=2) == {"flops": 30, "bytes": 6 * 4 + 6 * 2}
    # PV: P 6, V 12, O 8 elements
    assert cost.pv_cost(1, 2, 3, 4, 2) == {"flops": 48, "bytes": (6 + 12 + 8) * 2}
    # 64 heads scale every count by 64
    assert cost.pv_cost(64, 2, 3, 4, 2) == {k: 64 * v for k, v in cost.pv_cost(1, 2, 3, 4, 2).items()}


def test_standard_attention_at_the_benchmark_size():
    # B·H = 64, N = 4096, d = 128, bf16: S is 2^30 elements (2 GiB); the softmax moves it twice
    stages = cost.standard_attention_cost(64, 4096, 4096, 128, 2)
    assert stages["softmax"]["bytes"] == 2 * 2 * 2**30
    assert stages["qk"]["flops"] == stages["pv"]["flops"] == 2 * 2**30 * 128
    assert stages["total"]["bytes"] == sum(stages[s]["bytes"] for s in ("qk", "softmax", "pv"))
    assert cost.attention_flops(64, 4096, 4096, 128) == 4 * 2**30 * 128
    assert cost.attention_flops(64, 4096, 4096, 128, causal=True) == 2 * 2**30 * 128
    # QKᵀ at d = 128: 2·N²·d FLOPs over about 2·N² bytes of S: an intensity just under d = 128
    assert 120 < cost.arithmetic_intensity(stages["qk"]) < 128


def test_flash_attention_bytes_by_hand():
    # one head, M = N = 256, d = 64, bf16, blocks of 128 queries: Q and O once (2·256·64), K and V twice
    # (two query blocks), the float32 log-sum-exp of 256 queries
    got = cost.flash_attention_cost(1, 256, 256, 64, 2, block_m=128)
    assert got["bytes"] == (2 * 256 * 64 + 2 * 2 * 256 * 64) * 2 + 4 * 256
    # causal: block 0 needs keys 0..127, block 1 keys 0..255
    got = cost.flash_attention_cost(1, 256, 256, 64, 2, block_m=128, causal=True)
    assert got["bytes"] == (2 * 256 * 64 + 2 * (128 + 256) * 64) * 2 + 4 * 256
    assert got["flops"] == 4 * 256 * 256 * 64 // 2


def test_peak_memory_and_the_largest_n_that_fits():
    # 1 head, d = 8, bf16, eager (4 bytes per pair): N = 100 needs 4·100·8·2 + 4·100² = 46 400 bytes
    assert cost.standard_peak_bytes(1, 100, 100, 8, 2, 4) == 46_400
    assert cost.largest_n(46_400, 1, 8, 2, 4) == 100
    assert cost.largest_n(46_399, 1, 8, 2, 4) == 99
    # 80 GB, B·H = 64, d = 128, bf16, eager: N² ≈ 80e9 / 256, so N ≈ 17 600
    n = cost.largest_n(80e9, 64, 128, 2, 4)
    assert cost.standard_peak_bytes(64, n, n, 128, 2, 4) <= 80e9 < cost.standard_peak_bytes(64, n + 1, n + 1, 128, 2, 4)
    assert 17_000 < n < 17_700


@pytest.mark.parametrize("memory", [1, 10, 1e6, 3.3e9])
def test_largest_n_is_the_boundary(memory):
    n = cost.largest_n(memory, 3, 64, 2, 2)
    assert cost.standard_peak_bytes(3, n, n, 64, 2, 2) <= memory < cost.standard_peak_bytes(3, n + 1, n + 1, 64, 2, 2)
