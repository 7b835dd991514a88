"""Benchmarks: GPU timing, the machine's two ceilings, recorded results with provenance.

Owns: how anything is timed and how its memory is measured (`peak_mb`), the ceilings (device-to-device copy
bandwidth, dense bf16 matmul rate, and their CPU counterparts), the CSV files the course ships in course/results/,
their rows kept as they are measured (`Rows`), and `python -m course bench`. What each week measures is in
course/wNN/bench.py.

Two times for a kernel (`timed`): the kernel alone (`kernel_ms`: a CUDA graph replayed, the host's work per call
left out) and the time per call a user sees (`call_ms`: eager calls back to back, the host's clock), with the
host's own work per call (`host_us`) beside them. `gpu_ms` is events around eager calls, each after an L2 flush.
"""
import datetime
import importlib
import json
import math
import os
import platform
import subprocess
import statistics
import time
from pathlib import Path

from . import backend, registry

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


FLUSH_BYTES = 256 << 20  # several times any GPU's L2
_FLUSH = None            # the buffer _flush_l2 reads, allocated on first use


def _flush_l2() -> None:
    """Evict the L2 cache by reading a large buffer. Reading leaves clean lines behind; zeroing the
    buffer (what triton.testing.do_bench does) leaves tens of MB of dirty lines whose write-back is
    then charged to the next kernel timed: 6 µs on an H200, 8% of a 70 µs softmax."""
    import torch
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.ones(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    _FLUSH.sum()


def gpu_ms(fn, warmup_ms: float = 25, rep_ms: float = 200) -> float:
    """Median time of fn() in ms: device events around each call, after warm-up, with the L2
    flushed (by a read) before each call, so inputs start in HBM."""
    import torch
    fn()
    torch.cuda.synchronize()
    probe = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    probe[0].record()
    for _ in range(5):
        fn()
    probe[1].record()
    torch.cuda.synchronize()
    estimate = max(probe[0].elapsed_time(probe[1]) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    n = max(10, min(10_000, int(rep_ms / estimate)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for start, end in events:
        _flush_l2()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in events)
    return times[n // 2]


def reason(exc: BaseException) -> str:
    """An exception in one line, as a row's note: "out of memory", or its type and the first line of its message."""
    import torch
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "out of memory"
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}"


def attempt_ms(fn) -> tuple[float, str]:
    """(gpu_ms(fn), "") or, when fn fails, (nan, why): out of memory, or the error in one line. A benchmark
    records the reason and goes on; one peer that does not fit never costs the rows already measured."""
    import torch
    try:
        return gpu_ms(fn), ""
    except Exception as exc:  # noqa: BLE001 - out of memory, or a peer's own failure (unsupported shape, ...)
        torch.cuda.empty_cache()
        return float("nan"), reason(exc)


def copier(src, dst):
    """The copy yardstick of the `copy` rows and of the copy ceiling: a callable doing dst.copy_(src). Its kernel-alone
    time is eager events, never a graph replay: a device-to-device copy captured in a CUDA graph takes another path
    in the driver, which ran at 0.64 of the eager copy's bandwidth for copies of 0.5 to 2 GB on an H200
    (course/results, 2026-11-25; the PyTorch bug report "[CUDA Graph] Size-specific ~2.1x slowdown for contiguous CUDA
    Tensor.copy_ on GB200" describes the same divergence)."""
    def copy():
        return dst.copy_(src)
    copy.graph = False
    return copy


def kernel_ms(fn, rep_ms: float = 100) -> float:
    """The kernel alone: fn() captured once in a CUDA graph and the graph replayed (gpu_ms: L2 flushed before each
    replay, events around it), so the host's per-call work (Python, argument checks, the launch) is not counted.
    A callable marked `graph = False` (the copy yardstick, `copier`) is timed by eager events instead."""
    import torch
    if not getattr(fn, "graph", True):
        return gpu_ms(fn, rep_ms=rep_ms)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture: compilation, autotuning, first allocations
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    return gpu_ms(_captured(fn).replay, rep_ms=rep_ms)


def _captured(fn, tries: int = 2, mode: str = "global"):
    """fn() captured in a CUDA graph. A capture can fail once where the next succeeds (seen: the first autograd
    backward captured in a process); a failed capture leaves the CUDA random generator in capture mode, and every
    later torch.randn would raise "Offset increment outside graph capture", so its state is put back first."""
    import torch
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    for attempt in range(1, tries + 1):
        state = generator.clone_state()  # a fresh copy each time: the capture marks the state it finds as capturing
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode=mode):
                fn()
            return graph
        except Exception:
            generator.graphsafe_set_state(state)
            if attempt == tries:
                raise


def call_ms(fn, min_s: float = 0.03, rounds: int = 3) -> float:
    """The time per call a user sees: eager calls back to back, the host's clock from the first to the end of the
    last one's work. Where the host takes longer per call than the GPU, this is the host's time. The median of
    `rounds` batches of at least min_s each: the host is sometimes interrupted, and one slow batch is not the
    call's time."""
    import torch
    fn()
    torch.cuda.synchronize()

    def batch(calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        return time.perf_counter() - start

    calls = 1
    while batch(calls) < min_s and calls < 1 << 20:  # 1, 4, 16, ... calls: a 100 ms kernel is called twice, not 32 times
        calls *= 4
    return 1e3 * statistics.median(batch(calls) for _ in range(rounds)) / calls


def host_us(fn, calls: int = 200, gpu_ms: float = 0.0, rounds: int = 5) -> float:
    """The host's own work per call in µs: calls queued behind a long GPU sleep, so no call waits for the GPU; the
    median over `rounds` such batches (an interrupted batch is not the call's work). With each call's GPU time
    (gpu_ms), fewer calls (ten at least) keep the queued work near 200 ms."""
    import torch
    if gpu_ms > 0:
        calls = max(10, min(calls, int(200 / gpu_ms)))
    per_round = max(2, calls // rounds)
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        torch.cuda._sleep(int(1e8))  # about 50 ms of GPU clock cycles: longer than queueing a round's calls
        start = time.perf_counter()
        for _ in range(per_round):
            fn()
        samples.append((time.perf_counter() - start) / per_round)
        torch.cuda.synchronize()
    return 1e6 * statistics.median(samples)


def timed(fn) -> dict:
    """Both times of fn and the host's work per call, each NaN with the reason in "note" where it could not be
    measured (out of memory, a peer that fails, work a CUDA graph cannot hold): the run goes on."""
    import torch
    row, notes = {}, []
    for key, measure in (("ms", kernel_ms), ("call_ms", call_ms), ("host_us", host_us)):
        try:
            row[key] = measure(fn, gpu_ms=row["call_ms"]) if key == "host_us" and row["call_ms"] > 0 else measure(fn)
        except Exception as exc:  # noqa: BLE001 - out of memory, a peer's failure, a launch a graph cannot capture
            row[key] = math.nan
            notes.append(f"{key}: {reason(exc)}")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        if key == "ms" and math.isnan(row[key]) and "out of memory" not in notes[-1]:
            row[key], notes[-1] = attempt_ms(fn)[0], notes[-1] + " (eager events instead)"
    row["note"] = "; ".join(notes)
    return row


def rates(times: dict, nbytes: int, ceiling_gbps: float) -> dict:
    """A row's times (timed) with the bandwidth each gives for nbytes moved, and the kernel alone's share of the
    copy ceiling."""
    gbps, call_gbps = nbytes / times["ms"] / 1e6, nbytes / times["call_ms"] / 1e6
    return {"ms": round(times["ms"], 4), "call_ms": round(times["call_ms"], 4), "host_us": round(times["host_us"], 1),
            "GB/s": round(gbps, 1), "call_GB/s": round(call_gbps, 1), "vs_copy": round(gbps / ceiling_gbps, 3),
            "note": times["note"]}


def versus(table, peer_of, keys: list, column: str):
    """table with `column` (the kernel alone's GB/s over its peer's) and `call_<column>` (the same per call); the
    peer's row is found by peer_of(row), a tuple of the values of `keys`. NaN where either was not measured."""
    index = table.set_index(keys)
    for rate, name in (("GB/s", column), ("call_GB/s", f"call_{column}")):
        if rate not in table:
            continue
        peer = index[rate]
        table[name] = [round(r[rate] / peer.get(peer_of(r), math.nan), 2) for _, r in table.iterrows()]
    return table


def fits(nbytes: int, share: float = 0.8) -> str:
    """"" when nbytes fit in the GPU's free memory (a share of it), else why not: a size is skipped with its reason
    rather than lost to an out-of-memory error."""
    import torch
    free, _ = torch.cuda.mem_get_info()
    return "" if nbytes <= share * free else f"needs {nbytes / 1e9:.1f} GB, {free / 1e9:.1f} GB free"


class Rows(list):
    """A benchmark's rows, each also written to `partial` (one JSON line) the moment it is appended: a run that dies
    keeps every row it measured. `python -m course bench` points PARTIAL at the week's file."""
    PARTIAL: Path | None = None

    def append(self, row: dict) -> None:
        super().append(row)
        if Rows.PARTIAL is not None:
            with open(Rows.PARTIAL, "a") as f:
                f.write(json.dumps(row, default=str) + "\n")


def cpu_ms(fn, repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[len(times) // 2]


def peak_mb(fn) -> float:
    """The allocator's peak while fn() runs, above what was allocated before, in MB. One call first, so
    one-time allocations (cuBLAS's workspace, compiled kernels) are not counted."""
    import torch
    fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 1e6


def copy_ceiling_gbps(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, counting bytes read plus bytes written."""
    import torch
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return 2 * nbytes / gpu_ms(copier(src, dst)) / 1e6


def matmul_ceiling_tflops(n: int = 8192) -> float:
    """Dense bf16 matmul on random data."""
    import torch
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return 2 * n**3 / gpu_ms(lambda: a @ b) / 1e9


def cpu_ceilings(nbytes: int = 1 << 27, n: int = 1024) -> dict:
    """This CPU's copy bandwidth (GB/s) and float32 matmul rate (GFLOP/s), measured with NumPy."""
    import numpy as np
    src, dst = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)
    a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
    return {"copy_gbps": 2 * nbytes / cpu_ms(lambda: np.copyto(dst, src)) / 1e6,
            "matmul_gflops": 2 * n**3 / cpu_ms(lambda: a @ b) / 1e6}


def provenance() -> dict:
    """Device, date, library versions and commit: stamped on every recorded row."""
    import torch
    import triton
    try:
        import cupy
        cupy_version = cupy.__version__
    except ImportError:
        cupy_version = "none"
    commit = os.environ.get("COURSE_COMMIT")  # set where the tree has no .git (a copy sent to a GPU machine)
    try:
        commit = commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"kernels": registry.edition(), "device": backend.gpu_name(), "date": datetime.date.today().isoformat(),
            "torch": torch.__version__,
            "triton": triton.__version__, "cupy": cupy_version, "python": platform.python_version(),
            **{peer: _version_of(peer) for peer in PEER_PACKAGES}, "commit": commit}


PEER_PACKAGES = ("quack-kernels", "liger-kernel", "flash-attn-4", "nvidia-cutlass-dsl")  # stamped when installed


def _version_of(package: str) -> str:
    from importlib import metadata
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


REFERENCE_GPU = "h200"  # the GPU whose recordings the lessons' prose is checked against: course/results/<week>.csv


def gpu_slug(name: str) -> str:
    """"h100", "h200", ... from a device name ("NVIDIA H100 80GB HBM3" -> "h100"); the name lowered otherwise."""
    for word in name.lower().replace("-", " ").split():
        if word[:1] in "abhlv" and word[1:].isdigit():
            return word
    return "-".join(name.lower().split()) or "gpu"


def results_path(week: str, gpu: str = REFERENCE_GPU) -> Path:
    """Where `week`'s recorded results for `gpu` live: <week>.csv for the reference GPU, <week>.<gpu>.csv for others."""
    return RESULTS / (f"{week}.csv" if gpu == REFERENCE_GPU else f"{week}.{gpu}.csv")


def recorded(week: str, gpu: str = REFERENCE_GPU):
    """The GPU results the course ships for `week` on `gpu` ("h200", "h100"), as a pandas DataFrame. A part that
    stopped in that recording (its row "kernel": "all" says why) is taken from another GPU's recording that has it;
    every row names its device, so a lesson labels each measurement with the GPU it comes from."""
    import pandas as pd
    table = _whole_shapes(pd.read_csv(results_path(week, gpu)))
    if "part" not in table:
        return table
    stopped = set(table.loc[table["kernel"] == "all", "part"])
    for other in sorted(set(RESULTS.glob(f"{week}*.csv")) - {results_path(week, gpu)}):
        if not stopped:
            break
        rows = _whole_shapes(pd.read_csv(other))
        found = rows[rows["part"].isin(stopped) & (rows["kernel"] != "all")]
        table = pd.concat([table[~table["part"].isin(set(found["part"]))], found], ignore_index=True)
        stopped -= set(found["part"])
    return table


SHAPES = ("M", "N", "B", "H", "Hkv", "d", "step")  # a recording's shape columns: whole numbers


def _whole_shapes(table):
    """Shape columns as integers (a row without a shape, such as a part's "all" row, makes pandas read them as
    floats: 32.0); missing values stay missing."""
    for column in SHAPES:
        if column in table and table[column].dtype.kind == "f":
            table[column] = table[column].astype("Int64")
    return table


def resumed(partial: Path, parts: tuple) -> tuple[list, tuple]:
    """(rows, parts to run) to finish a benchmark that stopped: the rows `partial` holds of every part but the last
    one it reached (which may have stopped midway, so it runs again) and those that stopped, and the parts not
    finished, in order."""
    rows = [json.loads(line) for line in partial.read_text().splitlines() if line.strip()] if partial.exists() else []
    reached = [p for p in parts if any(r.get("part") == p for r in rows)]
    stopped = {r.get("part") for r in rows if r.get("kernel") == "all"}  # run_parts' row for a part that stopped
    finished = set(reached[:-1]) - stopped
    return [r for r in rows if r.get("part") in finished], tuple(p for p in parts if p not in finished)


def _run_week(week: str, resume: bool):
    """`week`'s benchmark table; with resume, the parts Rows.PARTIAL finished are kept and only the rest run."""
    module = importlib.import_module(f"course.{week}.bench")
    if not resume:
        Rows.PARTIAL.unlink(missing_ok=True)
        return module.run()
    if not hasattr(module, "PARTS"):
        raise SystemExit(f"{week}'s benchmark has no parts to resume: run it whole (without --resume)")
    kept, todo = resumed(Rows.PARTIAL, module.PARTS)
    print(f"{week}: resuming from {Rows.PARTIAL}: keeping {len(kept)} rows, running {', '.join(todo) or 'nothing'}")
    Rows.PARTIAL.write_text("".join(json.dumps(r, default=str) + "\n" for r in kept))
    return module.run(parts=todo, rows=Rows(kept))


def main(selector: str, csv: str | None, resume: bool = False) -> int:
    weeks = sorted({registry.week_of(e) for e in registry.select(selector)})
    if not backend.ON_GPU:
        print("No GPU here: benchmarks need one. Recorded results the course ships:")
        for week in weeks:
            path = RESULTS / f"{week}.csv"
            if path.exists():
                table = recorded(week)
                print(f"\n{path.relative_to(ROOT)} ({table['device'].iloc[0]}, {table['date'].iloc[0]})")
                print(table.drop(columns=["torch", "triton", "cupy", "python", "commit"]).to_string(index=False))
        return 0
    failed = 0
    for week in weeks:
        path = Path(csv) if csv else results_path(week, gpu_slug(backend.gpu_name()))
        Rows.PARTIAL = path.with_suffix(".partial.jsonl")
        stamp = provenance()
        try:
            table = _run_week(week, resume)
        except Exception as exc:  # noqa: BLE001 - the rows measured so far are kept in the partial file
            failed += 1
            print(f"{week}: the benchmark stopped ({type(exc).__name__}: {exc}); the rows it measured are in "
                  f"{Rows.PARTIAL}")
            continue
        finally:
            Rows.PARTIAL = None
        for key, value in stamp.items():
            table[key] = value
        table.to_csv(path, index=False)
        path.with_suffix(".partial.jsonl").unlink(missing_ok=True)
        print(table.drop(columns=list(stamp)).to_string(index=False))
        print(f"\nwrote {path} ({stamp['device']}, {stamp['date']})")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------------------------------
# Rows of the attention weeks (35-38): rates from both times, sizes not measured, memory peaks and parts that never
# stop the run, speedups over a peer. Each row keeps `ms` as the kernel alone (`timed`).

def missed(why: str) -> dict:
    """The times (as `timed` gives them) of something not measured: NaN, with the reason in "note"."""
    return {"ms": math.nan, "call_ms": math.nan, "host_us": math.nan, "note": why}


def with_rates(times: dict, flops: float = 0, nbytes: float = 0) -> dict:
    """A row's times (`timed` or `missed`) with the rates they give, each only where its amount is given: TFLOP/s for
    `flops`, GB/s for `nbytes`, from the kernel alone (`ms`) and per call (`call_TFLOP/s`, `call_GB/s`)."""
    row = dict(times)
    for rate, amount, unit in (("TFLOP/s", flops, 1e9), ("GB/s", nbytes, 1e6)):
        if amount:
            row[rate], row[f"call_{rate}"] = amount / times["ms"] / unit, amount / times["call_ms"] / unit
    row["note"] = row.pop("note", "")
    return row


def attempt_peak_mb(fn) -> tuple[float, str]:
    """(peak_mb(fn), "") or, where fn fails or runs out of memory, (nan, why): a memory row never stops the run."""
    import torch
    try:
        return peak_mb(fn), ""
    except Exception as exc:  # noqa: BLE001 - out of memory, or a peer's own failure
        why = reason(exc)
    torch.cuda.empty_cache()  # here, not in the except block: the traceback held the failed call's tensors
    return math.nan, why


def timed_peak(fn) -> dict:
    """`timed(fn)` and, where fn ran, the allocator's peak while it runs (`peak_MB`: `attempt_peak_mb`); a peak that
    could not be measured is NaN with its reason added to "note"."""
    times = timed(fn)
    peak, why = attempt_peak_mb(fn) if not math.isnan(times["ms"]) else (math.nan, "")
    note = "; ".join(filter(None, (times["note"], why and f"peak_MB: {why}")))
    return {**times, "peak_MB": peak, "note": note}


def run_parts(parts: dict, rows: "Rows | None" = None, desc: str = "") -> "Rows":
    """rows (a new Rows by default) after each part, {name: part(rows)}, appended its rows in order. A part that stops
    (an error no peer caught) leaves the rows it measured and one row {"part", "kernel": "all", "note"} saying why,
    and the next part runs."""
    import torch
    from tqdm.auto import tqdm  # here, not at import: notebooks import the weeks' modules without ipywidgets
    rows = Rows() if rows is None else rows
    for name, part in tqdm(parts.items(), desc=desc):
        try:
            part(rows)
        except Exception as exc:  # noqa: BLE001 - recorded; the other parts' rows are worth keeping
            rows.append({"part": name, "kernel": "all", **missed(f"the part stopped: {reason(exc)}")})
        torch.cuda.empty_cache()
    return rows


def speedups(table, keys: list):
    """table with `speedup` (the peer's `ms` over the row's: kernels alone) and `call_speedup` (the same with
    `call_ms`: per call). The peer is the row with the same `keys` whose "kernel" is this row's "peer"; NaN where
    either time is missing."""
    for ms, column in (("ms", "speedup"), ("call_ms", "call_speedup")):
        if ms not in table:
            continue
        peers = table.dropna(subset=[ms]).drop_duplicates(keys + ["kernel"]).set_index(keys + ["kernel"])[ms]
        table[column] = [peers.get(tuple(r[k] for k in keys) + (r["peer"],), math.nan) / r[ms]
                         for _, r in table.iterrows()]
    return table
