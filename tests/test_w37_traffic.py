"""Week 37's traffic curves (course/w37_flash_attention_core/traffic.py): the numbers behind the plots equal the
closed-form count and the cost model, hand-counted at chosen points, and the plots render with Agg."""
import io
import math

import numpy as np
import pytest

from course import attention_cost as cost
from course.w37_flash_attention_core import reference as ref
from course.w37_flash_attention_core import traffic

KB = traffic.KB


def test_the_gpus_shared_memory():
    assert traffic.SHARED_MEMORY == {"V100": 96 * KB, "A100": 164 * KB, "H100": 228 * KB}


@pytest.mark.parametrize("sram, d, element_size, blocks", [
    (16 * KB, 64, 4, (16, 16)),      # M = 4096 elements: ⌈4096 / 256⌉ = 16, min(16, 64) = 16
    (228 * KB, 64, 4, (228, 64)),    # 58368 elements / 256 = 228 query rows, keys capped at d
    (228 * KB, 128, 2, (228, 128)),  # 116736 / 512 = 228
    (96 * KB, 128, 2, (96, 96)),     # 49152 / 512 = 96 < d
])
def test_query_outer_blocks_are_the_papers_swapped(sram, d, element_size, blocks):
    assert traffic.query_outer_blocks(sram, d, element_size) == blocks
    assert traffic.query_outer_blocks(sram, d, element_size) == ref.sram_blocks(sram, d, element_size)[::-1]


def test_one_point_by_hand():
    # N = 4096, d = 64, float32, 228 KB: blocks of 228 queries, T_r = 18
    t = traffic.traffic_bytes(4096, 64, 228 * KB)
    nd = 4096 * 64
    assert t["flash"] == ((nd + 2 * nd * 18) + (nd + 4096)) * 4 == 39_862_272
    assert t["standard"] == (4 * 4096 ** 2 + 4 * nd) * 4 == 272_629_760
    assert t["bound"] == pytest.approx(4096 ** 2 * 64 ** 2 / (228 * KB / 4) * 4)


@pytest.mark.parametrize("n", [1, 37, 1000, 4096])
@pytest.mark.parametrize("sram", [8 * KB, 64 * KB, 164 * KB, 4096 * KB])
@pytest.mark.parametrize("element_size", [2, 4])
def test_flash_bytes_are_the_closed_form(n, sram, element_size):
    d, bh = 64, 3
    block_m, block_n = traffic.query_outer_blocks(sram, d, element_size)
    reads, writes = ref.hbm_traffic(bh, n, n, d, block_m, block_n)
    lse = bh * n  # one float32 per query, whatever the element size
    t = traffic.traffic_bytes(n, d, sram, element_size, bh)
    assert t["flash"] == (reads + writes - lse) * element_size + 4 * lse
    assert t["standard"] == cost.standard_attention_cost(bh, n, n, d, element_size)["total"]["bytes"]
    assert t["bound"] == pytest.approx(bh * ref.io_bound(n, d, sram, element_size) * element_size)


def test_flash_beats_standard_exactly_when_m_exceeds_2d2():
    n, d = 4096, 64  # 2d² = 8192 float32 elements = 32 KB
    for sram in traffic.SHARED_MEMORY.values():
        t = traffic.traffic_bytes(n, d, sram)
        assert t["flash"] < t["standard"] / 2.5
    assert traffic.traffic_bytes(n, d, 16 * KB)["flash"] > traffic.traffic_bytes(n, d, 16 * KB)["standard"]
    # the saving is about M / 2d² where the K, V re-reads dominate
    t = traffic.traffic_bytes(n, d, 164 * KB)
    assert t["standard"] / t["flash"] == pytest.approx(164 * KB / 4 / (2 * d * d), rel=0.05)


def test_slope_against_m_is_minus_one_where_the_bound_applies_then_flat():
    n, d = 4096, 64
    flash = {kb: traffic.traffic_bytes(n, d, kb * KB)["flash"] for kb in (16, 64, 4096, 8192)}
    slope = math.log(flash[64] / flash[16]) / math.log(4)
    assert -1.0 <= slope <= -0.97
    bound = {kb: traffic.traffic_bytes(n, d, kb * KB)["bound"] for kb in (16, 64)}
    assert math.log(bound[64] / bound[16]) / math.log(4) == pytest.approx(-1.0)
    # from M = 4Nd elements on, one query block holds every query: Q, K, V, O once and the LSE
    assert flash[4096] == flash[8192] == (4 * n * d + n) * 4
    # and the flash traffic stays about 8 N²d²/M (2 for K and V, 4 from M/4d) while the re-reads dominate
    assert 8 <= flash[16] / traffic.traffic_bytes(n, d, 16 * KB)["bound"] < 8.1


def test_slope_against_n_is_two_for_long_sequences():
    for sram in traffic.SHARED_MEMORY.values():
        t1, t2 = (traffic.traffic_bytes(n, 64, sram, 2)["flash"] for n in (16384, 65536))
        assert 1.9 < math.log(t2 / t1) / math.log(4) <= 2.0


def test_the_plots_draw_the_closed_form_and_render():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns, d, srams = np.array([256, 1024, 4096]), 64, {"A100": 164 * KB, "16 KB": 16 * KB}
    ax = traffic.plot_traffic_vs_n(ns, d, srams, element_size=2)
    standard, *curves = [line for line in ax.lines if len(line.get_xdata())]
    assert np.allclose(standard.get_ydata(), [traffic.traffic_bytes(n, d, KB, 2)["standard"] / 1e6 for n in ns])
    for (flash, bound), sram in zip(zip(curves[::2], curves[1::2]), srams.values()):
        points = [traffic.traffic_bytes(n, d, sram, 2) for n in ns]
        assert np.allclose(flash.get_ydata(), [p["flash"] / 1e6 for p in points])
        in_range = np.array([sram <= n * d * 2 for n in ns])  # the theorem's M <= Nd
        drawn = np.asarray(bound.get_ydata(), float)
        assert np.isnan(drawn[~in_range]).all()
        assert np.allclose(drawn[in_range], [p["bound"] / 1e6 for p, keep in zip(points, in_range) if keep])
    buffer = io.BytesIO()
    ax.figure.savefig(buffer, format="png")
    assert buffer.tell() > 10_000
    plt.close(ax.figure)

    srams_axis = np.array([16, 64, 256, 1024]) * KB
    ax = traffic.plot_traffic_vs_sram(2048, d, srams_axis, marks=traffic.SHARED_MEMORY)
    standard, flash, bound = ax.lines[:3]
    assert np.allclose(flash.get_ydata(), [traffic.traffic_bytes(2048, d, s)["flash"] / 1e6 for s in srams_axis])
    assert len(set(standard.get_ydata())) == 1                      # standard attention does not use M
    assert np.isnan(bound.get_ydata()[-1]) and not np.isnan(bound.get_ydata()[0])   # 1 MB > Nd = 512 KB
    assert len(ax.lines) == 3 + len(traffic.SHARED_MEMORY)          # one vertical line per GPU
    buffer = io.BytesIO()
    ax.figure.savefig(buffer, format="png")
    assert buffer.tell() > 10_000
    plt.close(ax.figure)
