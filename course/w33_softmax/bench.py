"""Week 33 benchmark: every softmax kernel of the course vs torch.softmax and the copy ceiling,
fp32 and bf16, one run, two times each (the kernel alone and the per-call time a user sees: course/bench.py).
Bytes come from the cost model (read x once, write y once)."""
import math

import pandas as pd
from tqdm.auto import tqdm

from .. import bench
from .reference import softmax_cost

SIZES = ((4096, 1024), (4096, 4096), (4096, 16384), (1024, 65536), (256, 262144))
DTYPES = ("float32", "bfloat16")
MAX_FUSED_COLS = 65536  # triton_softmax holds a whole row in one block


def kernels() -> dict:
    import torch
    from ..registry import kernels
    s = kernels("w33_softmax")
    return {"block_softmax": s.block_softmax, "warp_softmax": s.warp_softmax,
            "triton_softmax": s.triton_softmax, "online_softmax": s.online_softmax,
            "torch.softmax": lambda x, out=None: torch.softmax(x, dim=-1),
            "copy": lambda x, out: out.copy_(x)}


def run() -> pd.DataFrame:
    import torch
    ceiling = bench.copy_ceiling_gbps()
    matmul = bench.matmul_ceiling_tflops()
    rows = bench.Rows()
    work = [(d, m, n, k) for d in DTYPES for m, n in SIZES for k in kernels()]
    for dtype, m, n, name in tqdm(work, desc="w33 softmax"):
        if name == "triton_softmax" and n > MAX_FUSED_COLS:
            continue
        fn = kernels()[name]
        nbytes = softmax_cost(m, n, torch.tensor([], dtype=getattr(torch, dtype)).element_size())["bytes"]
        row = {"kernel": name, "dtype": dtype, "M": m, "N": n}
        if bench.fits(4 * nbytes):  # x, y and the float32 reference
            rows.append({**row, "ms": math.nan, "note": bench.fits(4 * nbytes)})
            continue
        x = torch.randn(m, n, device="cuda", dtype=getattr(torch, dtype)) * 4
        out = torch.empty_like(x)
        y = fn(x, out)
        error = 0.0 if name == "copy" else (y.float() - torch.softmax(x.float(), -1)).abs().max().item()
        times = bench.timed(lambda: fn(x, out))
        rows.append({**row, **bench.rates(times, nbytes, ceiling), "max_abs_error": f"{error:.1e}",
                     "copy_ceiling_GB/s": round(ceiling, 1), "matmul_ceiling_TFLOP/s": round(matmul, 1)})
        del x, out, y
    return bench.versus(pd.DataFrame(rows), lambda r: ("torch.softmax", r["dtype"], r["M"], r["N"]),
                        ["kernel", "dtype", "M", "N"], "vs_torch")


def tune(sizes=((4096, 16384), (1024, 65536), (256, 262144)), dtypes=DTYPES) -> pd.DataFrame:
    """Sweep online_softmax's block and warps (for choosing its defaults); GB/s per setting."""
    import torch
    from ..registry import kernels
    online_softmax = kernels("w33_softmax").online_softmax
    rows = []
    for dtype in dtypes:
        for m, n in sizes:
            x = torch.randn(m, n, device="cuda", dtype=getattr(torch, dtype))
            out = torch.empty_like(x)
            for block in (1024, 2048, 4096, 8192, 16384):
                for warps in (4, 8, 16, 32):
                    ms = bench.gpu_ms(lambda: online_softmax(x, out, block=block, num_warps=warps))
                    rows.append({"dtype": dtype, "M": m, "N": n, "block": block, "warps": warps,
                                 "GB/s": round(softmax_cost(m, n, x.element_size())["bytes"] / ms / 1e6)})
    return pd.DataFrame(rows)
