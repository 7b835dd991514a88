"""Week 37 benchmark, one run, bf16 (the issue's shapes: batch·N = 16384 tokens, heads·d = 2048):
- forward: TFLOP/s of the course's Triton FlashAttention forward against SDPA with each backend (FlashAttention-2,
  cuDNN, memory-efficient, math) and FlexAttention (causal), d ∈ {64, 128}, N = 512 … 16384, no mask and causal;
  FLOPs 4·B·H·N²·d, halved for causal (course/attention_cost.py). `speedup` is over SDPA's FlashAttention-2;
  The CuPy kernel (`cuda_flash_attention`, float32 arithmetic on bf16 storage) runs the same shapes;
- fp32: float32 at N = 4096, d ∈ {64, 128}: the CuPy kernel against week 35's composed float32 attention (three
  kernels and an N × N float32 buffer; `speedup` is over it), with each one's peak memory;
- memory: the allocator's peak of the forward against N (B = 1, H = 16, d = 128) for the course's two kernels and
  PyTorch's eager attention, next to the cost model: linear against quadratic."""
import math

import pandas as pd

from .. import attention_cost as cost
from .. import bench

TOKENS, WIDTH = 16384, 2048
SIZES = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
MEMORY_SIZES = (1024, 4096, 16384, 32768)
PEER = "SDPA FlashAttention-2"


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
    mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, n, n, device="cuda")
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v, causal: compiled(q, k, v, block_mask=mask)


def forward_rows(s37):
    import torch
    from torch.nn.attention import SDPBackend
    kernels = {"flash_attention": lambda q, k, v, causal: s37.flash_attention(q, k, v, causal=causal),
               "cuda_flash_attention": lambda q, k, v, causal: s37.cuda_flash_attention(q, k, v, causal=causal),
               PEER: _sdpa(SDPBackend.FLASH_ATTENTION), "SDPA cuDNN": _sdpa(SDPBackend.CUDNN_ATTENTION),
               "SDPA efficient": _sdpa(SDPBackend.EFFICIENT_ATTENTION), "SDPA math": _sdpa(SDPBackend.MATH)}
    rows = []
    for d in HEAD_DIMS:
        for n in SIZES:
            b, h = TOKENS // n, WIDTH // d
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for causal in (False, True):
                extra = {"FlexAttention": _flex_causal(n)} if causal else {}
                for name, fn in {**kernels, **extra}.items():
                    flops = cost.attention_flops(b * h, n, n, d, causal)
                    ms, note = bench.attempt_ms(lambda: fn(q, k, v, causal))  # SDPA math: N² scores may not fit
                    rows.append({"part": "forward", "kernel": name, "peer": PEER, "mask": "causal" if causal else "none",
                                 "B": b, "H": h, "N": n, "d": d, "ms": ms, "TFLOP/s": flops / ms / 1e9, "note": note})
            del q, k, v
    return rows


COMPOSED = "w35 attention (composed, float32)"


def fp32_rows(s37):
    import torch
    from ..registry import kernels
    s35 = kernels("w35_attention_blocks")
    rows = []
    n = 4096
    for d in HEAD_DIMS:
        b, h = TOKENS // n, WIDTH // d
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float32) for _ in range(3))
        for causal in (False, True):
            for name, fn in (("cuda_flash_attention", lambda: s37.cuda_flash_attention(q, k, v, causal=causal)),
                             (COMPOSED, lambda: s35.attention(q, k, v, causal=causal))):
                ms, note = bench.attempt_ms(fn)
                rows.append({"part": "fp32", "dtype": "float32", "kernel": name, "peer": COMPOSED,
                             "mask": "causal" if causal else "none", "B": b, "H": h, "N": n, "d": d, "ms": ms,
                             "TFLOP/s": cost.attention_flops(b * h, n, n, d, causal) / ms / 1e9,
                             "peak_MB": bench.peak_mb(fn) if not note else math.nan, "note": note})
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def memory_rows(s37):
    import torch
    from ..w36_mha_analysis.bench import eager_attention
    rows = []
    for n in MEMORY_SIZES:
        for name, attend in (("flash_attention", lambda q, k, v: s37.flash_attention(q, k, v)),
                             ("cuda_flash_attention", lambda q, k, v: s37.cuda_flash_attention(q, k, v)),
                             ("torch eager", eager_attention)):
            if name == "torch eager" and n > 16384:
                continue  # 16 heads × 32768² × 4 bytes: 69 GB, more than an 80 GB GPU spares
            def call():
                q, k, v = (torch.randn(1, 16, n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                return attend(q, k, v)
            square = 4 if name == "torch eager" else 0
            model = cost.standard_peak_bytes(16, n, n, 128, 2, square) + (4 * 16 * n if square == 0 else 0)
            try:
                peak, note = bench.peak_mb(call), ""
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                peak, note = math.nan, "out of memory"
            rows.append({"part": "memory", "kernel": name, "peer": "torch eager", "mask": "none", "B": 1, "H": 16, "N": n,
                         "d": 128, "peak_MB": peak, "model_MB": model / 1e6, "note": note})
    return rows


PARTS = ("forward", "fp32", "memory")


def run(parts=PARTS) -> pd.DataFrame:
    from tqdm.auto import tqdm  # here, not at import: notebooks import this module without ipywidgets
    from ..registry import kernels
    s37 = kernels("w37_flash_attention_core")
    matmul = bench.matmul_ceiling_tflops()
    rows = []
    for part in tqdm(parts, desc="w37 FlashAttention"):
        rows += globals()[f"{part}_rows"](s37)
    table = pd.DataFrame(rows)
    table.insert(0, "dtype", table.pop("dtype").fillna("bfloat16") if "dtype" in table else "bfloat16")
    for column in ("ms", "TFLOP/s", "peak_MB", "model_MB"):
        if column not in table:
            table[column] = float("nan")
    table["note"] = table["note"].fillna("") if "note" in table else ""
    peer_ms = table.set_index(["part", "kernel", "mask", "N", "d"])["ms"]
    table["speedup"] = [peer_ms.get((r.part, r.peer, r.mask, r.N, r.d), math.nan) / r.ms for r in table.itertuples()]
    table["vs_matmul"] = table["TFLOP/s"] / matmul
    table["matmul_ceiling_TFLOP/s"] = matmul
    return table.round({"ms": 4, "TFLOP/s": 1, "peak_MB": 1, "model_MB": 1, "speedup": 2, "vs_matmul": 3,
                        "matmul_ceiling_TFLOP/s": 1})
