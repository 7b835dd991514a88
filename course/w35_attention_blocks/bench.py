"""Week 35 benchmark, one run, bf16, B·H = 64 (B = 4, H = 16), M = N:
- qk: TFLOP/s of the Triton QKᵀ kernel (and the CUDA C tiled one) vs torch.matmul and the bf16 matmul ceiling;
- softmax: GB/s of the fused scale + mask + softmax (Triton, CUDA C) vs torch eager (scale, masked_fill,
  softmax) and the copy ceiling, no mask and causal;
- attention: time and peak extra memory of the composed attention vs torch's matmul-softmax-matmul,
  SDPA's math backend and SDPA's default (FlashAttention) for perspective.
`speedup` is the peer's time over this row's time, both from this run. FLOPs and bytes come from
reference.py's cost model."""
import math

import pandas as pd
from tqdm.auto import tqdm

from .. import bench
from . import reference as ref

B, H = 4, 16
QK_SIZES = [(n, d) for n in (1024, 4096) for d in (64, 128)]
SOFTMAX_SIZES = (1024, 2048, 4096)
MASKS = ("none", "causal")


def _causal_keep(n, device):
    import torch
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def qk_rows(s):
    import torch
    rows = []
    for n, d in QK_SIZES:
        q, k = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        out = torch.empty(B, H, n, n, device="cuda", dtype=torch.bfloat16)
        cost = ref.qk_cost(B * H, n, n, d, 2)
        fns = {"qk_scores": lambda: s.qk_scores(q, k, out=out),
               "torch.matmul": lambda: torch.matmul(q, k.transpose(-1, -2), out=out)}
        if n == 1024:
            fns["tiled_matmul"] = lambda: s.tiled_matmul(q, k, out=out)
        for name, fn in fns.items():
            ms = bench.gpu_ms(fn)
            rows.append({"part": "qk", "kernel": name, "peer": "torch.matmul", "mask": "none", "N": n, "d": d,
                         "ms": ms, "TFLOP/s": cost["flops"] / ms / 1e9, "GB/s": cost["bytes"] / ms / 1e6})
        del q, k, out
    return rows


def softmax_rows(s):
    import torch
    rows = []
    for n in SOFTMAX_SIZES:
        scores = torch.randn(B, H, n, n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(scores)
        keep = _causal_keep(n, "cuda")
        scale = 1 / math.sqrt(128)
        for mask in MASKS:
            causal = mask == "causal"
            eager = (lambda: torch.softmax((scores * scale).masked_fill(~keep, float("-inf")), dim=-1)) if causal \
                else (lambda: torch.softmax(scores * scale, dim=-1))
            fns = {"scale_mask_softmax": lambda: s.scale_mask_softmax(scores, out, scale, causal=causal),
                   "cuda_scale_mask_softmax": lambda: s.cuda_scale_mask_softmax(scores, out, scale, causal=causal),
                   "torch eager": eager, "copy": lambda: out.copy_(scores)}
            cost = ref.softmax_cost(B * H, n, n, 2, causal)
            for name, fn in fns.items():
                ms = bench.gpu_ms(fn)
                nbytes = 4 * B * H * n * n if name == "copy" else cost["bytes"]
                rows.append({"part": "softmax", "kernel": name, "peer": "torch eager", "mask": mask, "N": n,
                             "d": 128, "ms": ms, "GB/s": nbytes / ms / 1e6})
        del scores, out
    return rows


def attention_rows(s):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    rows = []

    def sdpa_math(q, k, v, causal):
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    for n, d in QK_SIZES:
        q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        keep = _causal_keep(n, "cuda")
        scale = 1 / math.sqrt(d)
        for mask in MASKS:
            causal = mask == "causal"

            def eager():
                scores = torch.matmul(q, k.transpose(-1, -2)) * scale
                if causal:
                    scores = scores.masked_fill(~keep, float("-inf"))
                return torch.matmul(torch.softmax(scores, dim=-1), v)
            fns = {"attention": lambda: s.attention(q, k, v, causal=causal),
                   "torch matmul-softmax-matmul": eager,
                   "SDPA math": lambda: sdpa_math(q, k, v, causal),
                   "SDPA default": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)}
            flops = ref.attention_flops(B * H, n, n, d) // (2 if causal else 1)
            for name, fn in fns.items():
                ms = bench.gpu_ms(fn)
                rows.append({"part": "attention", "kernel": name, "peer": "torch matmul-softmax-matmul",
                             "mask": mask, "N": n, "d": d, "ms": ms, "TFLOP/s": flops / ms / 1e9,
                             "peak_MB": bench.peak_mb(fn)})
        del q, k, v
    return rows


def run() -> pd.DataFrame:
    from ..registry import kernels
    s = kernels("w35_attention_blocks")
    copy, matmul = bench.copy_ceiling_gbps(), bench.matmul_ceiling_tflops()
    rows = []
    for part in tqdm((qk_rows, softmax_rows, attention_rows), desc="w35 attention blocks"):
        rows += part(s)
    table = pd.DataFrame(rows)
    table.insert(0, "dtype", "bfloat16")
    table.insert(1, "B", B)
    table.insert(2, "H", H)
    peer_ms = table.set_index(["part", "kernel", "mask", "N", "d"])["ms"]
    table["speedup"] = [peer_ms[(r.part, r.peer, r.mask, r.N, r.d)] / r.ms for r in table.itertuples()]
    table["vs_copy"] = table["GB/s"] / copy
    table["vs_matmul"] = table["TFLOP/s"] / matmul
    table["copy_ceiling_GB/s"], table["matmul_ceiling_TFLOP/s"] = copy, matmul
    return table.round({"ms": 4, "TFLOP/s": 1, "GB/s": 1, "peak_MB": 1, "speedup": 2, "vs_copy": 3,
                        "vs_matmul": 3, "copy_ceiling_GB/s": 1, "matmul_ceiling_TFLOP/s": 1})
