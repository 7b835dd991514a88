"""Week-34 stage-2 sweep (session 4): columns per program of weight_grad_kernel, at the backward's part counts.
Run on a GPU from the repository root: python3 tools/exp_w34_sum.py."""
import torch

from course import bench
from solutions import w34_layernorm as s

SMS = torch.cuda.get_device_properties(0).multi_processor_count
for n in (1024, 4096, 8192, 16384):
    for per_sm in (1, 2):
        parts = torch.randn(per_sm * SMS, n, device="cuda")
        like = torch.empty(1, dtype=torch.bfloat16, device="cuda")
        line = []
        for cols in (16, 32, 64, 128, 256):
            s.SUM_COLS = cols
            line.append(f"{cols}: {1e3 * bench.gpu_ms(lambda: s._sum_parts(parts, like), rep_ms=30):.1f} us")
        print(f"N={n} parts={per_sm * SMS}", " | ".join(line), flush=True)
