"""The benchmark machinery that runs without a GPU: rows kept as they are measured, ratios to peers."""
import json
import math
import sys
import types

import pandas as pd

from course import bench


def test_rows_are_written_the_moment_they_are_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.Rows, "PARTIAL", tmp_path / "w00.partial.jsonl")
    rows = bench.Rows()
    rows.append({"kernel": "a", "ms": 1.0})
    assert json.loads((tmp_path / "w00.partial.jsonl").read_text()) == {"kernel": "a", "ms": 1.0}
    rows.append({"kernel": "b", "ms": math.nan, "note": "out of memory"})
    assert len((tmp_path / "w00.partial.jsonl").read_text().splitlines()) == 2 and len(rows) == 2


def test_a_benchmark_that_dies_keeps_its_rows_and_fails_the_run(tmp_path, monkeypatch, capsys):
    def run():
        rows = bench.Rows()
        rows.append({"kernel": "measured before the crash", "ms": 0.5})
        raise RuntimeError("CUDA out of memory at N = 16384")
    monkeypatch.setattr(bench.backend, "ON_GPU", True)
    monkeypatch.setattr(bench, "provenance", lambda: {"device": "test"})
    monkeypatch.setitem(sys.modules, "course.w33_softmax.bench", types.SimpleNamespace(run=run))
    assert bench.main("w33", str(tmp_path / "w33.csv")) == 1
    kept = tmp_path / "w33.partial.jsonl"
    assert "measured before the crash" in kept.read_text() and str(kept) in capsys.readouterr().out
    assert bench.Rows.PARTIAL is None


def test_ratios_to_the_peer_for_both_times_and_nan_where_one_is_missing():
    table = pd.DataFrame([
        {"kernel": "course", "dtype": "bf16", "GB/s": 300.0, "call_GB/s": 100.0},
        {"kernel": "torch", "dtype": "bf16", "GB/s": 200.0, "call_GB/s": 200.0},
        {"kernel": "course", "dtype": "fp32", "GB/s": 300.0, "call_GB/s": 100.0},
    ])
    out = bench.versus(table, lambda r: ("torch", r["dtype"]), ["kernel", "dtype"], "vs_torch")
    assert list(out["vs_torch"][:2]) == [1.5, 1.0] and list(out["call_vs_torch"][:2]) == [0.5, 1.0]
    assert math.isnan(out["vs_torch"][2])


def test_rates_give_both_bandwidths_and_the_share_of_the_ceiling():
    times = {"ms": 0.01, "call_ms": 0.02, "host_us": 15.0, "note": ""}
    row = bench.rates(times, 30_000_000, 3000.0)
    assert (row["GB/s"], row["call_GB/s"], row["vs_copy"]) == (3000.0, 1500.0, 1.0)


def test_a_peer_that_cannot_be_imported_is_a_row_with_its_reason():
    from course import peers
    fn = peers._from("no_such_library_here", lambda lib: lambda: lib.softmax)
    try:
        fn()
    except RuntimeError as exc:
        assert "no_such_library_here not usable here: ModuleNotFoundError" in str(exc)
    else:
        raise AssertionError("an unusable peer must raise with its reason")


def test_a_part_that_stopped_on_the_reference_gpu_is_read_from_another_gpus_recording(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    pd.DataFrame([{"part": "a", "kernel": "k", "ms": 1.0, "device": "H200"},
                  {"part": "b", "kernel": "all", "ms": math.nan, "device": "H200"}]).to_csv(tmp_path / "wk.csv")
    pd.DataFrame([{"part": "a", "kernel": "k", "ms": 3.0, "device": "H100"},
                  {"part": "b", "kernel": "k", "ms": 2.0, "device": "H100"}]).to_csv(tmp_path / "wk.h100.csv")
    table = bench.recorded("wk")
    assert list(zip(table.part, table.ms, table.device)) == [("a", 1.0, "H200"), ("b", 2.0, "H100")]
    assert list(bench.recorded("wk", "h100").device) == ["H100", "H100"]  # nothing stopped there: its own rows


def test_the_copy_yardstick_is_timed_by_eager_events_never_from_a_cuda_graph(monkeypatch):
    """A device-to-device copy captured in a graph takes a slower path in the driver: the `copy` rows and the copy
    ceiling must time the copy the same way (eager events); every other kernel alone is a graph replay."""
    timed_by = []
    monkeypatch.setattr(bench, "gpu_ms", lambda fn, **kw: timed_by.append(fn) or 1.0)
    monkeypatch.setattr(bench, "_captured", lambda fn: (_ for _ in ()).throw(AssertionError("captured the copy")))
    src, dst = [1, 2], [0, 0]

    class Lists(list):
        def copy_(self, other):
            self[:] = other
            return self

    dst = Lists(dst)
    copy = bench.copier(src, dst)
    assert bench.kernel_ms(copy) == 1.0 and timed_by == [copy]
    assert copy() == [1, 2]
