"""The attention weeks' benchmarks (35-38) without a GPU: each run() on small CPU shapes, with course/bench.py's real
`timed` (its three measurements replaced by one call of the kernel and fixed times), fake course kernels of which some
run out of memory or fail, and a fake free memory under which the largest sizes and peers do not fit. Every run must
go on past each failure, record the reason in `note`, write each row as it is measured, and keep the columns its
notebooks read from the recorded CSV."""
import json
import math
import types

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from course import bench, registry
from course.w35_attention_blocks import bench as w35
from course.w36_mha_analysis import bench as w36
from course.w37_flash_attention_core import bench as w37
from course.w38_flash_attention_impl import bench as w38
from course.w38_flash_attention_impl import train as w38_train

MS, CALL_MS, HOST_US, PEAK_MB = 2.0, 4.0, 10.0, 7.0
FREE = 60e6  # bytes the fake GPU can spare: larger sizes and N × N peers get "needs … GB" instead of a time
PROVENANCE = {"device", "date", "torch", "triton", "cupy", "python", "commit", "kernels", *bench.PEER_PACKAGES}


def oom(*_, **__):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 34.00 GiB")


def broken(message):
    def fail(*_, **__):
        raise RuntimeError(message)
    return fail


def softmax(scores, out, scale, causal=False):
    if causal:
        n, m = scores.shape[-2:]
        scores = scores.masked_fill(~torch.ones(n, m, dtype=torch.bool).tril(), float("-inf"))
    return out.copy_(torch.softmax(scores * scale, dim=-1))


def attend(q, k, v, causal=False, **_):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


def fits(nbytes, share=0.8, free=FREE):
    return "" if nbytes <= free else f"needs {nbytes / 1e9:.1f} GB, {free / 1e9:.1f} GB free"


@pytest.fixture
def cpu_bench(monkeypatch, tmp_path):
    """bench as on a GPU whose every measurement is one call of the kernel; returns the partial file's path."""
    once = lambda value: lambda fn, *_, **__: (fn(), value)[1]  # noqa: E731
    for name, value in (("kernel_ms", MS), ("gpu_ms", MS), ("call_ms", CALL_MS), ("host_us", HOST_US),
                        ("peak_mb", PEAK_MB)):
        monkeypatch.setattr(bench, name, once(value))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *_: None)
    monkeypatch.setattr(bench, "fits", fits)
    monkeypatch.setattr(bench, "copy_ceiling_gbps", lambda: 3000.0)
    monkeypatch.setattr(bench, "matmul_ceiling_tflops", lambda: 800.0)
    partial = tmp_path / "week.partial.jsonl"
    monkeypatch.setattr(bench.Rows, "PARTIAL", partial)
    for week in (w35, w36, w37, w38):
        monkeypatch.setattr(week, "DEVICE", "cpu")
    return partial


def use_kernels(monkeypatch, **weeks):
    monkeypatch.setattr(registry, "kernels", lambda week: types.SimpleNamespace(**weeks[week]))


def check_written_and_columns(table, partial, week):
    """Every row was written as it was measured; no column the recorded results (and so the notebooks) have is lost;
    each time has its per-call twin."""
    assert len(partial.read_text().splitlines()) == len(table)
    recorded = set(bench.recorded(week).columns) - PROVENANCE
    assert recorded <= set(table.columns), recorded - set(table.columns)
    assert {"ms", "call_ms", "host_us", "note", "call_speedup"} <= set(table.columns)


def one(table, **where):
    rows = table
    for key, value in where.items():
        rows = rows[rows[key] == value]
    assert len(rows) == 1, (where, len(rows))
    return rows.iloc[0]


def test_w35_goes_on_past_peers_out_of_memory_failing_or_too_large(cpu_bench, monkeypatch):
    monkeypatch.setattr(w35, "B", 1)
    monkeypatch.setattr(w35, "H", 2)
    monkeypatch.setattr(w35, "QK_SIZES", [(1024, 8), (2048, 8)])
    monkeypatch.setattr(w35, "SOFTMAX_SIZES", (1024, 4096))
    use_kernels(monkeypatch, w35_attention_blocks={
        "qk_scores": oom, "tiled_matmul": lambda q, k, out: torch.matmul(q, k.transpose(-1, -2), out=out),
        "scale_mask_softmax": softmax, "cuda_scale_mask_softmax": broken("CUDA driver: no kernel image"),
        "attention": oom})
    table = w35.run()

    assert len(table) == 5 + 2 * 2 * 4 + 2 * 2 * 4  # qk: 3 kernels at N = 1024, 2 at 2048; softmax; attention
    check_written_and_columns(table, cpu_bench, "w35_attention_blocks")
    for n in (1024, 2048):
        failed, peer = one(table, part="qk", kernel="qk_scores", N=n), one(table, part="qk", kernel="torch.matmul", N=n)
        assert math.isnan(failed["ms"]) and "out of memory" in failed["note"] and math.isnan(failed["speedup"])
        flops = 2 * 2 * n * n * 8
        assert (peer["ms"], peer["call_ms"], peer["host_us"], peer["speedup"]) == (MS, CALL_MS, HOST_US, 1.0)
        assert peer["TFLOP/s"] == round(flops / MS / 1e9, 1) and peer["call_TFLOP/s"] == round(flops / CALL_MS / 1e9, 1)
    assert one(table, part="qk", kernel="tiled_matmul")["ms"] == MS

    soft = table[table.part == "softmax"]
    cuda = soft[(soft.kernel == "cuda_scale_mask_softmax") & (soft.N == 1024)]
    assert cuda["ms"].isna().all() and cuda["note"].str.contains("RuntimeError: CUDA driver: no kernel image").all()
    small, large = soft[soft.N == 1024], soft[soft.N == 4096]
    assert small[small.kernel != "cuda_scale_mask_softmax"]["GB/s"].notna().all()
    fused = one(small, kernel="scale_mask_softmax", mask="none")
    nbytes = w35.ref.softmax_cost(2, 1024, 1024, 2)["bytes"]
    assert (fused["GB/s"], fused["call_GB/s"]) == (round(nbytes / MS / 1e6, 1), round(nbytes / CALL_MS / 1e6, 1))
    assert fused["vs_copy"] == round(nbytes / MS / 1e6 / 3000.0, 3)
    assert len(large) == 8 and large["ms"].isna().all() and large["note"].str.startswith("needs").all()

    att = table[table.part == "attention"]
    ours = att[att.kernel == "attention"]
    assert ours["ms"].isna().all() and ours["peak_MB"].isna().all()
    assert ours[ours.N == 1024]["note"].str.contains("out of memory").all()
    for kernel in ("attention", "SDPA math", "torch matmul-softmax-matmul"):  # N × N: 2048 does not fit
        too_large = att[(att.kernel == kernel) & (att.N == 2048)]
        assert too_large["ms"].isna().all() and too_large["note"].str.startswith("needs").all()
    for kernel in ("SDPA math", "torch matmul-softmax-matmul", "SDPA default"):
        row = one(table, part="attention", kernel=kernel, N=1024, mask="causal")
        assert (row["ms"], row["peak_MB"], row["note"]) == (MS, PEAK_MB, "")
    default = att[att.kernel == "SDPA default"]
    assert (default["ms"] == MS).all() and (default["peak_MB"] == PEAK_MB).all()  # needs no N × N memory


def test_w35_a_part_that_stops_keeps_its_rows_and_the_next_part_runs(cpu_bench, monkeypatch):
    def stops(s, rows):
        rows.append({"part": "qk", "kernel": "torch.matmul", "peer": "torch.matmul", "mask": "none", "N": 1, "d": 1,
                     "ms": 1.0, "call_ms": 1.0, "note": ""})
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")
    monkeypatch.setattr(w35, "qk_rows", stops)
    monkeypatch.setattr(w35, "SOFTMAX_SIZES", (64,))
    use_kernels(monkeypatch, w35_attention_blocks={"scale_mask_softmax": softmax,
                                                   "cuda_scale_mask_softmax": softmax})
    table = w35.run(parts=("qk", "softmax"))
    assert list(table.part) == ["qk", "qk"] + ["softmax"] * 8
    assert table.iloc[0]["ms"] == 1.0 and table.iloc[1]["note"] == "the part stopped: out of memory"
    assert table[table.part == "softmax"]["ms"].eq(MS).all()
    assert len(cpu_bench.read_text().splitlines()) == len(table)


def test_resume_keeps_the_finished_parts_and_runs_the_part_that_stopped_again(cpu_bench, monkeypatch):
    measured = {"kernel": "torch.matmul", "peer": "torch.matmul", "mask": "none", "N": 1, "d": 1, "ms": 1.0,
                "call_ms": 1.0, "note": ""}
    cpu_bench.write_text("".join(json.dumps({"part": p, **measured}) + "\n" for p in ("qk", "qk", "softmax")))
    monkeypatch.setattr(w35, "PARTS", ("qk", "softmax"))
    monkeypatch.setattr(w35, "qk_rows", broken("a finished part ran again"))
    monkeypatch.setattr(w35, "SOFTMAX_SIZES", (64,))
    use_kernels(monkeypatch, w35_attention_blocks={"scale_mask_softmax": softmax,
                                                   "cuda_scale_mask_softmax": softmax})
    table = bench._run_week("w35_attention_blocks", resume=True)
    assert list(table.part) == ["qk", "qk"] + ["softmax"] * 8  # softmax's one stopped row measured again
    assert table[table.part == "softmax"]["ms"].eq(MS).all()
    assert len(cpu_bench.read_text().splitlines()) == len(table)  # a second stop would keep all of them
    kept, todo = bench.resumed(cpu_bench, ("qk", "softmax"))  # softmax reached last: it may not be finished
    assert [r["part"] for r in kept] == ["qk", "qk"] and todo == ("softmax",)
    cpu_bench.write_text(cpu_bench.read_text().replace('"part": "softmax"', '"part": "attention"', 1)
                         + json.dumps({"part": "qk", "kernel": "all", "note": "the part stopped: out of memory"}) + "\n")
    kept, todo = bench.resumed(cpu_bench, ("qk", "attention", "softmax"))  # a part that stopped runs again
    assert [r["part"] for r in kept] == ["attention"] and todo == ("qk", "softmax")


def test_resume_of_a_benchmark_without_parts_says_to_run_it_whole(cpu_bench):
    with pytest.raises(SystemExit, match="no parts to resume"):
        bench._run_week("w33_softmax", resume=True)


def test_w36_goes_on_past_failing_peers_and_records_memory_that_does_not_fit(cpu_bench, monkeypatch):
    for name, value in (("B", 1), ("H", 2), ("D", 8), ("STAGE_SIZES", (64,)), ("PIPELINE_SIZES", [(64, 8), (256, 8)]),
                        ("SHORT_KEYS", (16, 32)), ("MEMORY_SIZES", (64, 4096)), ("MEMORY_HEADS", 2)):
        monkeypatch.setattr(w36, name, value)
    use_kernels(monkeypatch,
                w35_attention_blocks={"scale_mask_softmax": softmax, "attention": broken("Triton: out of resources")},
                w36_mha_analysis={"batched_softmax": oom})
    table = w36.run()

    check_written_and_columns(table, cpu_bench, "w36_mha_analysis")
    assert set(table.part) == {"stage", "pipeline", "short", "memory"}
    stage = table[table.part == "stage"]
    assert len(stage) == 6 and (stage["ms"] == MS).all() and stage["intensity"].notna().all()
    assert stage["TFLOP/s"].notna().all() and stage["call_GB/s"].notna().all()

    pipe = table[table.part == "pipeline"]
    assert len(pipe) == 2 * 2 * 4
    week35 = pipe[pipe.kernel == "week 35 attention"]
    assert week35["ms"].isna().all() and week35["note"].str.contains("Triton: out of resources").all()
    others = pipe[pipe.kernel != "week 35 attention"]
    assert (others["ms"] == MS).all() and (others["peak_MB"] == PEAK_MB).all() and (others["speedup"] == 1.0).all()

    short = table[table.part == "short"]
    batched = short[short.kernel == "batched_softmax"]
    assert batched["GB/s"].isna().all() and batched["note"].str.contains("out of memory").all()
    assert short[short.kernel != "batched_softmax"]["GB/s"].notna().all()

    memory = table[table.part == "memory"]
    assert len(memory) == 4 and memory["model_MB"].notna().all()
    assert (memory[memory.N == 64]["peak_MB"] == PEAK_MB).all()
    assert memory[memory.N == 4096]["peak_MB"].isna().all()
    assert memory[memory.N == 4096]["note"].str.startswith("needs").all()


def test_w37_goes_on_past_sdpa_math_that_does_not_fit_and_kernels_that_fail(cpu_bench, monkeypatch):
    for name, value in (("TOKENS", 4096), ("WIDTH", 16), ("SIZES", (64, 1024)), ("HEAD_DIMS", (8,)),
                        ("FP32_N", 256), ("MEMORY_SIZES", (64, 2048))):
        monkeypatch.setattr(w37, name, value)
    monkeypatch.setattr(w37, "_flex_causal", lambda n: broken("inductor: no compiler found"))
    use_kernels(monkeypatch, w37_flash_attention_core={"flash_attention": attend, "cuda_flash_attention": oom},
                w35_attention_blocks={"attention": attend})
    table = w37.run()

    check_written_and_columns(table, cpu_bench, "w37_flash_attention_core")
    fwd = table[table.part == "forward"]
    assert len(fwd) == 2 * (7 + 8)  # two sizes; seven kernels (FlashAttention-4 among them), FlexAttention if causal
    fa4 = fwd[fwd.kernel == "FlashAttention-4"]  # not installed here: its rows say why
    assert fa4.ms.isna().all() and fa4.note.str.contains("flash_attn.cute not usable here").all()
    math_rows = fwd[fwd.kernel == "SDPA math"].set_index("N")
    assert (math_rows.loc[64, "ms"] == MS).all() and math_rows.loc[64, "TFLOP/s"].notna().all()
    assert math_rows.loc[1024, "ms"].isna().all() and math_rows.loc[1024, "note"].str.startswith("needs").all()
    assert fwd[fwd.kernel == "cuda_flash_attention"]["note"].str.contains("out of memory").all()
    assert fwd[fwd.kernel == "FlexAttention"]["note"].str.contains("inductor: no compiler found").all()
    for kernel in ("SDPA cuDNN", "SDPA efficient"):  # not on a CPU: the run records why and goes on
        failed = fwd[fwd.kernel == kernel]
        assert failed["ms"].isna().all() and (failed["note"] != "").all()
    ours = fwd[(fwd.kernel == "flash_attention") & (fwd.N == 1024)]
    assert (ours["ms"] == MS).all() and (ours["call_ms"] == CALL_MS).all() and ours["call_TFLOP/s"].notna().all()

    fp32 = table[table.part == "fp32"]
    assert set(fp32.dtype) == {"float32"} and len(fp32) == 4
    assert (fp32[fp32.kernel == w37.COMPOSED]["peak_MB"] == PEAK_MB).all()
    assert fp32[fp32.kernel == "cuda_flash_attention"]["peak_MB"].isna().all()

    memory = table[table.part == "memory"].set_index(["kernel", "N"])
    assert len(memory) == 6 and memory.loc[("flash_attention", 2048), "peak_MB"] == PEAK_MB
    assert math.isnan(memory.loc[("cuda_flash_attention", 64), "peak_MB"])  # peak_mb's own OOM, caught
    assert memory.loc[("cuda_flash_attention", 64), "note"] == "out of memory"
    assert memory.loc[("torch eager", 2048), "note"].startswith("needs")  # N × N: 268 MB


def test_w38_goes_on_past_failures_in_every_part(cpu_bench, monkeypatch):
    for name, value in (("TOKENS", 1024), ("WIDTH", 16), ("SIZES", (64, 256)), ("HEAD_DIMS", (8,)), ("STEP_N", 256),
                        ("GQA_SIZES", (1024,)), ("TC_SIZES", (256,)), ("DECODE_BATCHES", (1,)),
                        ("DECODE_SIZES", (1024, 1 << 20))):
        monkeypatch.setattr(w38, name, value)
    monkeypatch.setattr(w38, "_flex", lambda *_: broken("inductor: no compiler found"))
    monkeypatch.setattr(bench, "fits", lambda nbytes, share=0.8: fits(nbytes, free=200e6))  # GQA's 32 heads of 128

    def flash_attn(q, k, v, causal=False):
        return oom() if q.shape[2] >= 256 and k.shape[1] == q.shape[1] else attend(q, k, v, causal)

    def flash_forward(q, k, v, causal=False, seq_parallel=True, **_):
        if not seq_parallel:
            raise ValueError("tiles do not fit in shared memory")
        return attend(q, k, v, causal)

    def train(fn, *_, **__):
        if fn is not w38_train.sdpa_attention:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return types.SimpleNamespace(loss=[3.5, 3.0, 2.5])
    monkeypatch.setattr(w38_train, "train", train)
    use_kernels(monkeypatch, w37_flash_attention_core={"cuda_flash_attention": attend},
                w38_flash_attention_impl={"flash_attn": flash_attn, "flash_forward": flash_forward,
                                          "flash_attn_varlen": broken("NotImplementedYet: solve w38.varlen first"),
                                          "flash_decode": lambda q, k, v, splits=None: attend(q, k, v),
                                          "tc_flash_attention": oom})
    table = w38.run()

    check_written_and_columns(table, cpu_bench, "w38_flash_attention_impl")
    back = table[table.part == "backward"]
    assert len(back) == 2 * 2 * 4 * 3  # sizes, masks, kernels, passes
    ours = back[back.kernel == "flash_attn"].set_index(["N", "mask", "pass"])
    out_of_memory = "ms: out of memory; call_ms: out of memory; host_us: out of memory"
    assert ours.loc[(256, "none", "backward"), "note"] == out_of_memory  # the forward's reason: no backward tried
    assert ours.loc[(64, "none", "backward"), "ms"] == MS and ours.loc[(64, "none", "backward"), "speedup"] == 1.0
    both = ours.loc[(64, "causal", "forward+backward")]
    assert (both["ms"], both["call_ms"], both["host_us"]) == (2 * MS, 2 * CALL_MS, 2 * HOST_US)
    fa2 = back[(back.kernel == w38.FA2) & (back.N == 256)]
    assert (fa2["ms"] == fa2["pass"].map({"forward": MS, "backward": MS, "forward+backward": 2 * MS})).all()

    steps = table[table.part == "fa2_steps"]
    first = steps[steps.kernel.str.startswith("1 ")]
    assert first["ms"].isna().all() and first["note"].str.contains("ValueError: tiles do not fit").all()
    assert (steps[~steps.kernel.str.startswith("1 ")]["ms"] == MS).all()

    gqa = table[table.part == "gqa"]
    assert len(gqa) == 2 * 2 * 3 and gqa["ms"].eq(gqa["pass"].map({"forward+backward": 2 * MS}).fillna(MS)).all()

    varlen = table[table.part == "varlen"].set_index(["kernel", "pass"])
    assert "NotImplementedYet" in varlen.loc[("flash_attn_varlen", "forward"), "note"]
    assert "inductor" in varlen.loc[("FlexAttention (document mask)", "backward"), "note"]
    assert varlen.loc[(w38.FA2 + " (padded)", "backward"), "ms"] == MS

    decode = table[table.part == "decode"]
    small, large = decode[decode.N == 1024], decode[decode.N == 1 << 20]
    kv_bytes = 2 * 1 * 8 * 1024 * 128 * 2
    assert (small["kernel_ms"] == small["ms"]).all() and (small["GB/s"] == round(kv_bytes / MS / 1e6, 1)).all()
    assert (small["call_GB/s"] == round(kv_bytes / CALL_MS / 1e6, 1)).all()
    assert len(large) == 3 and large["ms"].isna().all() and large["note"].str.startswith("needs").all()

    tc = table[table.part == "tensor_cores"]
    assert tc[tc.kernel == "tc_flash_attention"]["note"].str.contains("out of memory").all()
    assert (tc[tc.kernel != "tc_flash_attention"]["ms"] == MS).all()

    trained = table[table.part == "train"]
    assert list(trained[trained.kernel == "SDPA"]["loss"]) == [3.5, 3.0, 2.5]
    assert one(table, part="train", kernel="flash_attn")["note"] == "out of memory"


def test_a_peak_that_runs_out_of_memory_keeps_the_times(cpu_bench):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) > 3:  # the three timings run; the peak's call does not fit
            oom()
    row = bench.timed_peak(fn)
    assert (row["ms"], row["call_ms"], row["host_us"]) == (MS, CALL_MS, HOST_US)
    assert math.isnan(row["peak_MB"]) and row["note"] == "peak_MB: out of memory"


def test_rates_of_a_missed_row_are_nan_and_keep_the_reason():
    row = bench.with_rates(bench.missed("needs 90.0 GB, 70.0 GB free"), flops=1e12, nbytes=1e9)
    assert all(math.isnan(row[key]) for key in ("ms", "call_ms", "TFLOP/s", "call_TFLOP/s", "GB/s", "call_GB/s"))
    assert row["note"] == "needs 90.0 GB, 70.0 GB free" and list(row)[-1] == "note"


def test_speedups_use_the_peer_of_the_same_shape_for_both_times():
    table = pd.DataFrame([
        {"kernel": "ours", "peer": "torch", "N": 1, "ms": 1.0, "call_ms": 4.0},
        {"kernel": "torch", "peer": "torch", "N": 1, "ms": 2.0, "call_ms": 2.0},
        {"kernel": "ours", "peer": "torch", "N": 2, "ms": 1.0, "call_ms": 1.0},
        {"kernel": "torch", "peer": "torch", "N": 2, "ms": math.nan, "call_ms": math.nan, "note": "out of memory"},
    ])
    out = bench.speedups(table, ["N"])
    assert list(out["speedup"][:2]) == [2.0, 1.0] and list(out["call_speedup"][:2]) == [0.5, 1.0]
    assert out["speedup"][2:].isna().all() and out["call_speedup"][2:].isna().all()


def test_w39_runs_every_part_with_the_real_kernels_and_goes_on_past_missing_peers(cpu_bench, monkeypatch):
    """Week 39's run() on tiny CPU shapes with the course's own kernels (the interpreter): every stage and peer has a
    row, peers that cannot run here (Liger not installed, torch.compile replaced by a failing stand-in for one mode)
    have the reason in `note`, and the ratios to each peer are filled where both were measured."""
    from course.w39_kernel_fusion import bench as w39
    for name, value in (("DEVICE", "cpu"), ("SIZES", ((3, 32), (4, 64))), ("AUTOTUNE_SIZE", (4, 64)),
                        ("GEMM_SIZES", (32,)), ("ATTENTION_N", (16,)), ("PROJECTION_N", (16,)), ("TOKENS", 32),
                        ("HEADS", 2), ("HEAD_DIM", 16)):
        monkeypatch.setattr(w39, name, value)
    monkeypatch.setattr(w39, "_compiled", lambda fn, mode=None: fn if mode is None else broken("no autotuning here"))
    monkeypatch.setattr(w39, "_liger", lambda module, cls: broken(f"liger_kernel.ops.{module} not usable here"))
    tiny = 1e-5  # ms: tiny shapes need tiny times for GB/s that survive rounding to 0.1
    for name in ("kernel_ms", "call_ms"):
        monkeypatch.setattr(w39.bench, name, lambda fn, *_, **__: (fn(), tiny)[1])
    table = w39.run()

    assert len(cpu_bench.read_text().splitlines()) == len(table)
    assert not (table["kernel"] == "all").any(), table[table["kernel"] == "all"]["note"].tolist()
    ew = table[table.part.str.startswith("elementwise")]
    ours = ew[ew.kernel == ew.stage]
    assert len(ours) == 2 * 2 * 13  # 2 dtypes, 2 sizes, 13 stages
    cuda, triton = ours[ours.stage.str.startswith("cuda")], ours[~ours.stage.str.startswith("cuda")]
    assert cuda["ms"].isna().all() and cuda["note"].str.contains("GPU").all()  # CUDA C runs on a GPU only
    assert triton["ms"].notna().all() and triton["vs_torch"].eq(1.0).all() and triton["vs_compile"].eq(1.0).all()
    liger = ew[ew.kernel.str.startswith("liger")]
    assert len(liger) == 2 * 2 * 6 and liger["ms"].isna().all() and liger["note"].str.contains("not usable").all()
    autotuned = ew[ew.kernel.str.startswith("max-autotune")]
    assert set(zip(autotuned.dtype, autotuned.M)) == {("bfloat16", 4)} and autotuned["ms"].isna().all()
    gelu = one(table, kernel="bias_gelu none", dtype="float32", M=4)
    assert gelu["GB/s"] == round(w39.ref.stage_bytes("bias_gelu", 4, 64, 4) / tiny / 1e6, 1)
    assert set(table[table.part == "attention"].stage) == {"rope", "alibi"}
    assert set(table[table.part == "projection"].stage) == {"output projection", "qkv projection"}
    rest = table[~table.part.str.startswith("elementwise")]
    missing = rest[rest["TFLOP/s"].isna()]  # Liger (stood in by a failure), SDPA's efficient backend (GPU only)
    assert set(missing.kernel) == {"liger rope + SDPA FlashAttention-2", "SDPA with a materialised ALiBi bias"}
    assert missing["note"].str.contains("not usable here|No viable backend").all()
    for kernel in ("rope_attention", "alibi_attention", "matmul_bias_gelu", "attention_output_projection",
                   "qkv_rope_projection"):
        assert rest[rest.kernel == kernel]["speedup"].notna().all(), kernel
