"""Week 33 benchmark: every softmax kernel of the course vs torch.softmax and the copy ceiling,
fp32 and bf16, one run. Bytes come from the cost model (read x once, write y once)."""
import pandas as pd
from tqdm.auto import tqdm

from .. import bench
from .reference import softmax_cost

SIZES = ((4096, 1024), (4096, 4096), (4096, 16384), (1024, 65536), (256, 262144))
DTYPES = ("float32", "bfloat16")
MAX_FUSED_COLS = 65536  # triton_softmax holds a whole row in one block


def kernels() -> dict:
    import torch
    from solutions import w33_softmax as s
    return {"block_softmax": s.block_softmax, "warp_softmax": s.warp_softmax,
            "triton_softmax": s.triton_softmax, "online_softmax": s.online_softmax,
            "torch.softmax": lambda x, out=None: torch.softmax(x, dim=-1),
            "copy": lambda x, out: out.copy_(x)}


def run() -> pd.DataFrame:
    import torch
    ceiling = bench.copy_ceiling_gbps()
    matmul = bench.matmul_ceiling_tflops()
    rows = []
    work = [(d, m, n, k) for d in DTYPES for m, n in SIZES for k in kernels()]
    for dtype, m, n, name in tqdm(work, desc="w33 softmax"):
        if name == "triton_softmax" and n > MAX_FUSED_COLS:
            continue
        fn = kernels()[name]
        x = torch.randn(m, n, device="cuda", dtype=getattr(torch, dtype)) * 4
        out = torch.empty_like(x)
        y = fn(x, out)
        error = 0.0 if name == "copy" else (y.float() - torch.softmax(x.float(), -1)).abs().max().item()
        ms = bench.gpu_ms(lambda: fn(x, out))
        gbps = softmax_cost(m, n, x.element_size())["bytes"] / ms / 1e6
        rows.append({"kernel": name, "dtype": dtype, "M": m, "N": n, "ms": round(ms, 4), "GB/s": round(gbps, 1),
                     "vs_copy": round(gbps / ceiling, 3), "max_abs_error": f"{error:.1e}",
                     "copy_ceiling_GB/s": round(ceiling, 1), "matmul_ceiling_TFLOP/s": round(matmul, 1)})
    table = pd.DataFrame(rows)
    torch_gbps = table[table.kernel == "torch.softmax"].set_index(["dtype", "M", "N"])["GB/s"]
    table["vs_torch"] = [round(r["GB/s"] / torch_gbps[(r["dtype"], r["M"], r["N"])], 2) for _, r in table.iterrows()]
    return table


def tune(sizes=((4096, 16384), (1024, 65536), (256, 262144)), dtypes=DTYPES) -> pd.DataFrame:
    """Sweep online_softmax's block and warps (for choosing its defaults); GB/s per setting."""
    import torch
    from solutions.w33_softmax import online_softmax
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
