"""Week 37 benchmark, one run, bf16 (batch·N = 16384 tokens, heads·d = 2048 at every N):
- forward: TFLOP/s of the course's Triton FlashAttention forward against SDPA with each backend (FlashAttention-2,
  cuDNN, memory-efficient, math), FlexAttention (causal) and FlashAttention-4 (course/peers.py), d ∈ {64, 128},
  N = 512 … 16384, no mask and causal;
  FLOPs 4·B·H·N²·d, halved for causal (course/attention_cost.py). `speedup` is over SDPA's FlashAttention-2;
  The CuPy kernel (`cuda_flash_attention`, float32 arithmetic on bf16 storage) runs the same shapes;
- fp32: float32 at N = 4096, d ∈ {64, 128}: the CuPy kernel against week 35's composed float32 attention (three
  kernels and an N × N float32 buffer; `speedup` is over it), with each one's peak memory;
- memory: the allocator's peak of the forward against N (B = 1, H = 16, d = 128) for the course's two kernels and
  PyTorch's eager attention, next to the cost model: linear against quadratic.
Two times per timed row (course/bench.py `timed`): `ms` the kernel alone and `call_ms` per call, with `TFLOP/s` and
`call_TFLOP/s`; `call_speedup` is `speedup` per call. A size or peer that does not fit in memory (SDPA math's N × N
scores), or fails, has NaN and the reason in `note`, and the run goes on.

`tune_tiles` is the sweep that chose the Triton forward's GPU tiles (GPU_TILES): not part of
run()."""
import math

import pandas as pd

from .. import attention_cost as cost
from .. import bench, peers

TOKENS, WIDTH = 16384, 2048
SIZES = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
MEMORY_SIZES = (1024, 4096, 16384, 32768)
FP32_N = 4096
PEER = "SDPA FlashAttention-2"
DEVICE = "cuda"
COMPOSED = "w35 attention (composed, float32)"
# bytes per (query, key) pair a peer holds at its peak, asked of the free memory (bench.fits) before it runs: SDPA's
# math backend computes bf16 in float32 (scores and probabilities, and a margin), week 35's composed attention holds a
# float32 S (and a margin); the others hold no N × N matrix
PAIR_BYTES = {"SDPA math": 12, COMPOSED: 8}


def _sdpa(backend):
    import torch
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def _flex_causal(n):
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    torch._dynamo.reset()  # a fresh compile per shape: past its cache limit, dynamo would fall back to eager
    try:
        mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, n, n, device=DEVICE)
    except Exception as exc:  # noqa: BLE001 - recorded on the peer's rows, like any peer's failure
        why = f"block mask: {bench.reason(exc)}"

        def failed(*_):
            raise RuntimeError(why)
        return failed
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v, causal: compiled(q, k, v, block_mask=mask)


def _randn(*shape, dtype="bfloat16"):
    import torch
    return torch.randn(*shape, device=DEVICE, dtype=getattr(torch, dtype))


def forward_rows(s37, rows=None):
    import torch
    from torch.nn.attention import SDPBackend
    kernels = {"flash_attention": lambda q, k, v, causal: s37.flash_attention(q, k, v, causal=causal),
               "cuda_flash_attention": lambda q, k, v, causal: s37.cuda_flash_attention(q, k, v, causal=causal),
               PEER: _sdpa(SDPBackend.FLASH_ATTENTION), "SDPA cuDNN": _sdpa(SDPBackend.CUDNN_ATTENTION),
               "SDPA efficient": _sdpa(SDPBackend.EFFICIENT_ATTENTION), "SDPA math": _sdpa(SDPBackend.MATH),
               "FlashAttention-4": peers.flash_attention_4()}
    rows = bench.Rows() if rows is None else rows
    for d in HEAD_DIMS:
        for n in SIZES:
            b, h = TOKENS // n, WIDTH // d
            why = bench.fits(4 * b * h * n * d * 2)  # q, k, v, the output
            q = k = v = None  # allocated only where they fit
            if not why:
                q, k, v = (_randn(b, h, n, d) for _ in range(3))
            for causal in (False, True):
                extra = {"FlexAttention": _flex_causal(n) if not why else None} if causal else {}
                flops = cost.attention_flops(b * h, n, n, d, causal)
                for name, fn in {**kernels, **extra}.items():
                    skip = why or bench.fits(PAIR_BYTES.get(name, 0) * b * h * n * n)  # SDPA math: N² scores
                    times = bench.missed(skip) if skip else bench.timed(lambda: fn(q, k, v, causal))
                    rows.append({"part": "forward", "kernel": name, "peer": PEER,
                                 "mask": "causal" if causal else "none", "B": b, "H": h, "N": n, "d": d,
                                 **bench.with_rates(times, flops)})
            del q, k, v
            torch.cuda.empty_cache()
    return rows


def fp32_rows(s37, rows=None):
    import torch
    from ..registry import kernels
    s35 = kernels("w35_attention_blocks")
    rows = bench.Rows() if rows is None else rows
    n = FP32_N
    for d in HEAD_DIMS:
        b, h = TOKENS // n, WIDTH // d
        why = bench.fits(4 * b * h * n * d * 4)  # q, k, v, the output
        q = k = v = None  # allocated only where they fit
        if not why:
            q, k, v = (_randn(b, h, n, d, dtype="float32") for _ in range(3))
        for causal in (False, True):
            for name, fn in (("cuda_flash_attention", lambda: s37.cuda_flash_attention(q, k, v, causal=causal)),
                             (COMPOSED, lambda: s35.attention(q, k, v, causal=causal))):
                skip = why or bench.fits(PAIR_BYTES.get(name, 0) * b * h * n * n)
                times = {**bench.missed(skip), "peak_MB": math.nan} if skip else bench.timed_peak(fn)
                rows.append({"part": "fp32", "dtype": "float32", "kernel": name, "peer": COMPOSED,
                             "mask": "causal" if causal else "none", "B": b, "H": h, "N": n, "d": d,
                             **bench.with_rates(times, cost.attention_flops(b * h, n, n, d, causal))})
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def memory_rows(s37, rows=None):
    from ..w36_mha_analysis.bench import eager_attention
    rows = bench.Rows() if rows is None else rows
    for n in MEMORY_SIZES:
        for name, attend in (("flash_attention", lambda q, k, v: s37.flash_attention(q, k, v)),
                             ("cuda_flash_attention", lambda q, k, v: s37.cuda_flash_attention(q, k, v)),
                             ("torch eager", eager_attention)):
            def call():
                q, k, v = (_randn(1, 16, n, 128) for _ in range(3))
                return attend(q, k, v)
            square = 4 if name == "torch eager" else 0
            model = cost.standard_peak_bytes(16, n, n, 128, 2, square) + (4 * 16 * n if square == 0 else 0)
            why = bench.fits(1.25 * model)  # torch eager at N = 32768: 16 heads × 32768² × 4 bytes, 69 GB
            peak, why = (math.nan, why) if why else bench.attempt_peak_mb(call)
            rows.append({"part": "memory", "kernel": name, "peer": "torch eager", "mask": "none", "B": 1, "H": 16,
                         "N": n, "d": 128, "peak_MB": peak, "model_MB": model / 1e6, "note": why})
    return rows


PARTS = ("forward", "fp32", "memory")


def run(parts=PARTS, rows=None) -> pd.DataFrame:
    from ..registry import kernels
    s37 = kernels("w37_flash_attention_core")
    matmul = bench.matmul_ceiling_tflops()
    rows = bench.run_parts({p: lambda rows, p=p: globals()[f"{p}_rows"](s37, rows) for p in parts},
                           desc="w37 FlashAttention", rows=rows)
    table = pd.DataFrame(rows)
    table.insert(0, "dtype", table.pop("dtype").fillna("bfloat16") if "dtype" in table else "bfloat16")
    for column in ("peer", "mask", "N", "d", "ms", "call_ms", "TFLOP/s", "peak_MB", "model_MB"):
        if column not in table:  # a run of some parts may have none of a column
            table[column] = math.nan
    table["note"] = table["note"].fillna("") if "note" in table else ""
    table = bench.speedups(table, ["part", "mask", "N", "d"])
    table["vs_matmul"] = table["TFLOP/s"] / matmul
    table["matmul_ceiling_TFLOP/s"] = matmul
    return table.round({"ms": 4, "call_ms": 4, "host_us": 1, "TFLOP/s": 1, "call_TFLOP/s": 1, "peak_MB": 1,
                        "model_MB": 1, "speedup": 2, "call_speedup": 2, "vs_matmul": 3, "matmul_ceiling_TFLOP/s": 1})


# ---------------------------------------------------------------- the sweep of the Triton forward's tiles
TUNE_SIZES = (2048, 4096, 8192)
# (BLOCK_M, BLOCK_N, num_warps, STAGES) tried per head dimension
TILES = {64: [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 4, 3), (128, 64, 4, 4)],
         128: [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3), (128, 64, 4, 3)]}


def tune_tiles(sizes=TUNE_SIZES, head_dims=HEAD_DIMS, tiles=TILES, dtype="bfloat16") -> pd.DataFrame:
    """flash_attention at each tile (BLOCK_M, BLOCK_N, num_warps, STAGES), the benchmark's shapes, no mask and
    causal, against SDPA's FlashAttention-2 and cuDNN backends timed on the same inputs (`vs_fa2`, `vs_cudnn`); each
    tile checked against FlashAttention-2's output first. `current` marks the kernel's GPU_TILES entry."""
    import torch
    from torch.nn.attention import SDPBackend
    from ..registry import kernels
    s37 = kernels("w37_flash_attention_core")
    fa2, cudnn = _sdpa(SDPBackend.FLASH_ATTENTION), _sdpa(SDPBackend.CUDNN_ATTENTION)
    rows = []
    for d in head_dims:
        for n in sizes:
            b, h = TOKENS // n, WIDTH // d
            q, k, v = (_randn(b, h, n, d, dtype=dtype) for _ in range(3))
            for causal in (False, True):
                flops = cost.attention_flops(b * h, n, n, d, causal)
                peers = {name: bench.attempt_ms(lambda fn=fn: fn(q, k, v, causal))[0]
                         for name, fn in (("fa2", fa2), ("cudnn", cudnn))}
                try:
                    want = fa2(q, k, v, causal).float()
                except Exception:  # noqa: BLE001 - no FlashAttention-2 here: checked against float32 math instead
                    want = _sdpa(SDPBackend.MATH)(q.float(), k.float(), v.float(), causal)
                for tile in tiles[d]:
                    fn = lambda tile=tile: s37.flash_attention(q, k, v, causal=causal, tiles=tile)  # noqa: E731
                    try:
                        error = (fn()[0].float() - want).abs().max().item()
                        ms, note = bench.attempt_ms(fn)
                    except Exception as exc:  # noqa: BLE001 - a tile that does not fit shared memory: recorded
                        error, ms, note = math.nan, math.nan, bench.reason(exc)
                    rows.append({"d": d, "N": n, "B": b, "H": h, "mask": "causal" if causal else "none", "tile": tile,
                                 "current": tile == getattr(s37, "GPU_TILES", {}).get(d), "ms": ms,
                                 "TFLOP/s": flops / ms / 1e9, "vs_fa2": peers["fa2"] / ms,
                                 "vs_cudnn": peers["cudnn"] / ms, "max_abs_error": error, "note": note})
            del q, k, v, want
            torch.cuda.empty_cache()
    return pd.DataFrame(rows).round({"ms": 4, "TFLOP/s": 1, "vs_fa2": 3, "vs_cudnn": 3})
