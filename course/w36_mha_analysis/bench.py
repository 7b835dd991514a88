"""Week 36 benchmark, one run, bf16, d = 128 unless said:
- stage: each stage of standard attention timed alone (B = 4, H = 16, N = 1024 … 8192): QKᵀ and PV by
  cuBLAS (torch.matmul), the scale + mask + softmax by the course's fused kernel and by torch eager; with
  the cost model's FLOPs and bytes, so each stage lands on the roofline;
- pipeline: standard attention as cuBLAS GEMMs around the course's fused softmax (option C of "Standing on Shoulders Properly":
  `cublas_softmax_attention`), against torch's eager matmul-softmax-matmul (the peer), week 35's three
  Triton kernels and SDPA's default backend (a fused flash-attention kernel: cuDNN's with torch 2.11 on an
  H200), no mask and causal, with the peak memory;
- short: the softmax on short rows (N = 64 … 512 keys, M = 4096 queries): `batched_softmax` (several rows per
  program) against week 35's `scale_mask_softmax` (one row per program) and torch eager, in GB/s;
- memory: the allocator's peak of standard attention against N (B = 1, H = 16) for the eager chain and for
  option C, next to the cost model's `standard_peak_bytes`.
`peak_MB`: in the memory rows the inputs are drawn inside the measured call, so it counts Q, K, V as the
model does; in the pipeline rows they exist before it, so it is the memory the attention adds.
Two times per timed row (course/bench.py `timed`): `ms` the kernel alone and `call_ms` per call, with the rates of
each (`TFLOP/s`, `GB/s`; `call_TFLOP/s`, `call_GB/s`). A size or peer that does not fit in memory, or fails, has NaN
and the reason in `note`. FLOPs, bytes and memory come from course/attention_cost.py. `speedup` is the peer's time
over the row's (`call_speedup`: the same per call)."""
import math

import pandas as pd

from .. import attention_cost as cost
from .. import bench
from ..bench import peak_mb  # noqa: F401 (the notebooks call it from here too)

B, H, D = 4, 16, 128
DEVICE = "cuda"
STAGE_SIZES = (1024, 2048, 4096, 8192)
PIPELINE_SIZES = [(n, D) for n in (1024, 2048, 4096, 8192)] + [(4096, 64)]
MEMORY_SIZES = (1024, 2048, 4096, 8192, 16384)
SHORT_KEYS = (64, 128, 256, 512)
MEMORY_HEADS = 16
# bytes per (query, key) pair alive at the peak: eager holds two 16-bit squares (S and P), option C one
SQUARE_BYTES = {"torch eager": 4, "cuBLAS + fused softmax": 2}
# the same for each pipeline, week 35's attention holding a float32 S; FIT_MARGIN times what the model says is asked
# of the free memory before a size or peer is run (bench.fits), so one that cannot fit gets NaN and the reason
PIPELINE_SQUARE_BYTES = {**SQUARE_BYTES, "week 35 attention": 4, "SDPA default": 0}
FIT_MARGIN = 2


def eager_attention(q, k, v, causal=False):
    """PyTorch's eager matmul-softmax-matmul: each step its own kernel, S and P in the inputs' dtype."""
    import torch
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]))
    if causal:
        keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def cublas_softmax_attention(q, k, v, softmax, causal=False):
    """Option C: S = Q Kᵀ by cuBLAS, `softmax(scores, out=, scale=, causal=)` writing P over S (one launch for
    all heads), O = P V by cuBLAS. One 16-bit (M, N) buffer per head at the peak."""
    import torch
    scores = torch.matmul(q, k.transpose(-1, -2))
    probs = softmax(scores, out=scores, scale=1 / math.sqrt(q.shape[-1]), causal=causal)
    return torch.matmul(probs, v)


def _randn(*shape):
    import torch
    return torch.randn(*shape, device=DEVICE, dtype=torch.bfloat16)


def stage_rows(s35, rows=None):
    import torch
    rows = bench.Rows() if rows is None else rows
    for n in STAGE_SIZES:
        why = bench.fits(4 * B * H * n * D * 2 + 5 * B * H * n * n * 2)  # q, k, v, out; S, P and eager's three
        q = k = v = scores = probs = out = keep = None  # allocated only where they fit
        if not why:
            q, k, v = (_randn(B, H, n, D) for _ in range(3))
            scores = torch.matmul(q, k.transpose(-1, -2))
            probs, out = torch.empty_like(scores), torch.empty_like(q)
            keep = torch.ones(n, n, dtype=torch.bool, device=DEVICE).tril()
        scale = 1 / math.sqrt(D)
        for mask in ("none", "causal"):
            causal = mask == "causal"
            eager = (lambda: torch.softmax((scores * scale).masked_fill(~keep, float("-inf")), dim=-1)) if causal \
                else (lambda: torch.softmax(scores * scale, dim=-1))
            fns = {("qk", "cuBLAS"): (lambda: torch.matmul(q, k.transpose(-1, -2), out=scores),
                                      cost.qk_cost(B * H, n, n, D, 2)),
                   ("softmax", "fused softmax"): (lambda: s35.scale_mask_softmax(scores, probs, scale, causal=causal),
                                                  cost.softmax_cost(B * H, n, n, 2, causal)),
                   ("softmax", "torch eager"): (eager, cost.softmax_cost(B * H, n, n, 2, causal)),
                   ("pv", "cuBLAS"): (lambda: torch.matmul(probs, v, out=out), cost.pv_cost(B * H, n, n, D, 2))}
            for (stage, kernel), (fn, model) in fns.items():
                if causal and stage != "softmax":
                    continue  # the GEMMs do the same work with or without the mask
                peer = "torch eager" if stage == "softmax" else kernel
                times = bench.missed(why) if why else bench.timed(fn)
                rows.append({"part": "stage", "stage": stage, "kernel": kernel, "peer": peer, "mask": mask, "N": n,
                             "d": D, "flops": model["flops"], "bytes": model["bytes"],
                             "intensity": model["flops"] / model["bytes"],
                             **bench.with_rates(times, model["flops"], model["bytes"])})
        del q, k, v, scores, probs, out, keep, fns
        torch.cuda.empty_cache()
    return rows


def pipeline_rows(s35, rows=None):
    import torch
    F = torch.nn.functional
    rows = bench.Rows() if rows is None else rows
    for n, d in PIPELINE_SIZES:
        why = bench.fits(4 * B * H * n * d * 2)  # q, k, v, the output
        q = k = v = None  # allocated only where they fit
        if not why:
            q, k, v = (_randn(B, H, n, d) for _ in range(3))
        for mask in ("none", "causal"):
            causal = mask == "causal"
            fns = {"cuBLAS + fused softmax": lambda: cublas_softmax_attention(q, k, v, s35.scale_mask_softmax, causal),
                   "torch eager": lambda: eager_attention(q, k, v, causal),
                   "week 35 attention": lambda: s35.attention(q, k, v, causal=causal),
                   "SDPA default": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)}
            flops = cost.attention_flops(B * H, n, n, d, causal)
            for name, fn in fns.items():
                skip = why or bench.fits(FIT_MARGIN * PIPELINE_SQUARE_BYTES[name] * B * H * n * n)
                times = {**bench.missed(skip), "peak_MB": math.nan} if skip else bench.timed_peak(fn)
                rows.append({"part": "pipeline", "stage": "attention", "kernel": name, "peer": "torch eager",
                             "mask": mask, "N": n, "d": d, "flops": flops, **bench.with_rates(times, flops)})
        del q, k, v, fns
        torch.cuda.empty_cache()
    return rows


def short_rows(s35, rows=None):
    import torch
    from ..registry import kernels
    s36 = kernels("w36_mha_analysis")
    rows = bench.Rows() if rows is None else rows
    for n in SHORT_KEYS:
        model = cost.softmax_cost(B * H, 4096, n, 2)
        why = bench.fits(FIT_MARGIN * 3 * B * H * 4096 * n * 2)  # scores, out, eager's output
        scores = out = None  # allocated only where they fit
        if not why:
            scores = _randn(B, H, 4096, n)
            out = torch.empty_like(scores)
        fns = {"batched_softmax": lambda: s36.batched_softmax(scores, out, 0.125),
               "scale_mask_softmax": lambda: s35.scale_mask_softmax(scores, out, 0.125),
               "torch eager": lambda: torch.softmax(scores * 0.125, dim=-1)}
        for name, fn in fns.items():
            times = bench.missed(why) if why else bench.timed(fn)
            rows.append({"part": "short", "stage": "softmax", "kernel": name, "peer": "torch eager", "mask": "none",
                         "N": n, "d": D, "flops": model["flops"], "bytes": model["bytes"],
                         **bench.with_rates(times, nbytes=model["bytes"])})
        del scores, out, fns
        torch.cuda.empty_cache()
    return rows


def memory_rows(s35, rows=None):
    rows = bench.Rows() if rows is None else rows
    for n in MEMORY_SIZES:
        for name, square in SQUARE_BYTES.items():
            def run():
                q, k, v = (_randn(1, MEMORY_HEADS, n, D) for _ in range(3))
                if name == "torch eager":
                    return eager_attention(q, k, v)
                return cublas_softmax_attention(q, k, v, s35.scale_mask_softmax)
            model = cost.standard_peak_bytes(MEMORY_HEADS, n, n, D, 2, square)
            why = bench.fits(FIT_MARGIN * model)
            peak, why = (math.nan, why) if why else bench.attempt_peak_mb(run)
            rows.append({"part": "memory", "stage": "attention", "kernel": name, "peer": "torch eager", "mask": "none",
                         "N": n, "d": D, "peak_MB": peak, "model_MB": model / 1e6, "note": why})
    return rows


PARTS = ("stage", "pipeline", "short", "memory")


def run(parts=PARTS, rows=None) -> pd.DataFrame:
    from ..registry import kernels
    s35 = kernels("w35_attention_blocks")
    copy, matmul = bench.copy_ceiling_gbps(), bench.matmul_ceiling_tflops()
    rows = bench.run_parts({p: lambda rows, p=p: globals()[f"{p}_rows"](s35, rows) for p in parts},
                           desc="w36 standard attention", rows=rows)
    table = pd.DataFrame(rows)
    table.insert(0, "dtype", "bfloat16")
    table.insert(1, "B", [1 if p == "memory" else B for p in table.part])
    table.insert(2, "H", [MEMORY_HEADS if p == "memory" else H for p in table.part])
    for column in ("stage", "peer", "mask", "N", "d", "ms", "call_ms", "TFLOP/s", "GB/s", "peak_MB"):
        if column not in table:  # a run of some parts may have none of a column
            table[column] = math.nan
    table["note"] = table["note"].fillna("")
    table = bench.speedups(table, ["part", "stage", "mask", "N", "d"])
    table["vs_copy"] = table["GB/s"] / copy
    table["vs_matmul"] = table["TFLOP/s"] / matmul
    table["copy_ceiling_GB/s"], table["matmul_ceiling_TFLOP/s"] = copy, matmul
    return table.round({"ms": 4, "call_ms": 4, "host_us": 1, "intensity": 2, "TFLOP/s": 1, "call_TFLOP/s": 1,
                        "GB/s": 1, "call_GB/s": 1, "peak_MB": 1, "model_MB": 1, "speedup": 2, "call_speedup": 2,
                        "vs_copy": 3, "vs_matmul": 3, "copy_ceiling_GB/s": 1, "matmul_ceiling_TFLOP/s": 1})
