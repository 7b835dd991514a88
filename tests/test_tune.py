"""The launch-setting sweeps of weeks 35 and 37 (`tune_*` in their bench.py) on CPU: the real kernels in Triton's
interpreter at tiny sizes, every timing replaced by one call. Each setting is checked against PyTorch before it is
timed, a setting that fails is recorded with its reason, and the launcher's own setting is marked."""
import types

import pytest
import torch

from course import bench
from course.w35_attention_blocks import bench as w35
from course.w37_flash_attention_core import bench as w37

MS = 2.0
DTYPE = "float16"  # bf16 arithmetic is wrong in the interpreter


@pytest.fixture
def cpu_timing(monkeypatch):
    monkeypatch.setattr(bench, "gpu_ms", lambda fn, *_, **__: (fn(), MS)[1])
    monkeypatch.setattr(bench, "copy_ceiling_gbps", lambda: 3000.0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    for week in (w35, w37):
        monkeypatch.setattr(week, "DEVICE", "cpu")
    monkeypatch.setattr(w35, "B", 1)
    monkeypatch.setattr(w35, "H", 2)


def test_w35_qk_and_pv_sweeps_check_time_and_mark_the_current_tile(cpu_timing):
    from course.registry import kernels
    s = kernels("w35_attention_blocks")
    qk = w35.tune_qk(sizes=((40, 16),), tiles=[s.QK_TILE, (32, 32, 1, 1, 4), (32, 32, 3, 2, 4)], dtype=DTYPE)
    pv = w35.tune_pv(sizes=((40, 16),), tiles=[s.PV_TILE, (16, 16, 4, 1)], dtype=DTYPE)
    flops = 2 * 2 * 40 * 40 * 16
    for table in (qk, pv):
        assert table["current"].tolist() == [True] + [False] * (len(table) - 1)
        assert (table["max_abs_error"] < 0.1).all() and (table["ms"] == MS).all() and (table["note"] == "").all()
        assert (table["TFLOP/s"] == round(flops / MS / 1e9, 1)).all() and (table["vs_torch"] == 1.0).all()
    assert s.QK_TILE != (32, 32, 3, 2, 4) and s.PV_TILE != (16, 16, 4, 1)  # restored after the sweep


def test_w35_softmax_sweep_has_each_warp_count_and_the_launcher(cpu_timing):
    table = w35.tune_softmax(sizes=(40,), warps=(1, 4), dtype=DTYPE)
    assert len(table) == 2 * 3 and set(table["warps"]) == {1, 4, "launcher"}
    assert (table["max_abs_error"] < 0.02).all() and (table["note"] == "").all()
    causal = table[table["mask"] == "causal"].iloc[0]
    nbytes = w35.ref.softmax_cost(2, 40, 40, 2, True)["bytes"]
    assert causal["vs_copy"] == round(nbytes / MS / 1e6 / 3000.0, 3)


def test_w37_tile_sweep_records_a_failing_tile_and_goes_on(cpu_timing, monkeypatch):
    from course import registry
    s37 = registry.kernels("w37_flash_attention_core")

    def flash_attention(q, k, v, causal=False, tiles=None):
        if tiles == (16, 16, 4, 1):
            raise RuntimeError("out of resources: shared memory")
        return s37.flash_attention(q, k, v, causal=causal, tiles=tiles)
    monkeypatch.setattr(registry, "kernels", lambda week: types.SimpleNamespace(
        flash_attention=flash_attention, GPU_TILES={16: (32, 16, 4, 1)}))
    monkeypatch.setattr(w37, "TOKENS", 32)
    monkeypatch.setattr(w37, "WIDTH", 32)
    table = w37.tune_tiles(sizes=(32,), head_dims=(16,), tiles={16: [(32, 16, 4, 1), (16, 16, 4, 1), (32, 32, 4, 1)]},
                           dtype=DTYPE)
    assert len(table) == 2 * 3 and set(table["mask"]) == {"none", "causal"}
    assert (table["B"] == 1).all() and (table["H"] == 2).all()
    good = table[table["tile"] != (16, 16, 4, 1)]
    assert (good["max_abs_error"] < 1e-2).all() and (good["ms"] == MS).all() and (good["note"] == "").all()
    bad = table[table["tile"] == (16, 16, 4, 1)]
    assert bad["ms"].isna().all() and bad["note"].str.contains("out of resources").all()
    assert table["current"].tolist() == [True, False, False] * 2
