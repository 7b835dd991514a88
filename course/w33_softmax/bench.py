"""Week 33 benchmark: every softmax kernel of the course vs torch.softmax and the copy ceiling,
fp32 and bf16, one run, two times each (the kernel alone and the per-call time a user sees: course/bench.py),
with QuACK, Liger-Kernel and torch.compile beside them (course/peers.py). Bytes come from the cost model (read x once, write y
once)."""
import math

import pandas as pd
from tqdm.auto import tqdm

from .. import bench, peers
from .reference import softmax_cost

SIZES = ((4096, 1024), (4096, 4096), (4096, 16384), (1024, 65536), (256, 262144))
DTYPES = ("float32", "bfloat16")
MAX_FUSED_COLS = 65536  # triton_softmax holds a whole row in one block


def kernels() -> dict:
    import torch
    from ..registry import kernels
    s = kernels("w33_softmax")
    return {"block_softmax": s.block_softmax, "warp_softmax": s.warp_softmax,
            "triton_softmax": s.triton_softmax, "online_softmax": s.online_softmax, "split_softmax": s.split_softmax,
            "torch.softmax": lambda x, out=None: torch.softmax(x, dim=-1)}


LIBRARIES = {"quack": "quack.softmax", "liger": "liger softmax", "compile": "torch.compile softmax"}
COURSE = ("block_softmax", "warp_softmax", "triton_softmax", "online_softmax", "split_softmax")


def run() -> pd.DataFrame:
    import torch
    ceiling = bench.copy_ceiling_gbps()
    matmul = bench.matmul_ceiling_tflops()
    rows = bench.Rows()
    for dtype, (m, n) in tqdm([(d, s) for d in DTYPES for s in SIZES], desc="w33 softmax"):
        nbytes = softmax_cost(m, n, torch.tensor([], dtype=getattr(torch, dtype)).element_size())["bytes"]
        row = {"dtype": dtype, "M": m, "N": n}
        why = bench.fits(4 * nbytes)  # x, y and the float32 reference
        if why:
            rows.append({**row, "kernel": "all", "ms": math.nan, "note": why})
            continue
        x = torch.randn(m, n, device="cuda", dtype=getattr(torch, dtype)) * 4
        out = torch.empty_like(x)
        expected = torch.softmax(x.float(), -1)
        fns = {name: (lambda fn=fn: fn(x, out)) for name, fn in kernels().items()
               if name != "triton_softmax" or n <= MAX_FUSED_COLS}
        fns["copy"] = bench.copier(x, out)  # the yardstick, timed by eager events (bench.copier)
        for name, fn in {**fns, **peers.softmax(x)}.items():
            try:
                error = 0.0 if name == "copy" else f"{(fn().float() - expected).abs().max().item():.1e}"
            except Exception as exc:  # noqa: BLE001 - a peer that fails: its row says why (timed records it)
                error = f"{type(exc).__name__}"
            times = bench.timed(fn)
            rows.append({**row, "kernel": name, **bench.rates(times, nbytes, ceiling), "max_abs_error": error,
                         "copy_ceiling_GB/s": round(ceiling, 1), "matmul_ceiling_TFLOP/s": round(matmul, 1)})
        del x, out, expected
        torch.cuda.empty_cache()
    table = bench.versus(pd.DataFrame(rows), lambda r: ("torch.softmax", r["dtype"], r["M"], r["N"]),
                         ["kernel", "dtype", "M", "N"], "vs_torch")
    for library, peer in LIBRARIES.items():
        table = bench.versus(table, lambda r: (peer if r["kernel"] in COURSE else None, r["dtype"], r["M"], r["N"]),
                             ["kernel", "dtype", "M", "N"], f"vs_{library}")
    return table


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


def tune_split(sizes=((4096, 16384), (1024, 65536), (256, 262144)), dtypes=DTYPES,
               kilobytes=(8, 16, 32, 64), columns_per_thread=(16, 32, 64)) -> pd.DataFrame:
    """Sweep split_softmax's bytes per program and columns per thread (for choosing SPLIT_BYTES); each setting
    checked against torch.softmax, then its share of an eager copy of the same tensor (L2 flushed for both).
    GPU only."""
    import torch
    from ..registry import kernels
    split_softmax = kernels("w33_softmax").split_softmax
    rows = []
    for dtype in dtypes:
        for m, n in sizes:
            x = torch.randn(m, n, device="cuda", dtype=getattr(torch, dtype)) * 4
            out = torch.empty_like(x)
            want = torch.softmax(x.float(), -1)
            copy = bench.gpu_ms(bench.copier(x, out))
            for kb in kilobytes:
                block = kb * 1024 // x.element_size()
                for per_thread in columns_per_thread:
                    warps = block // (32 * per_thread)
                    if not 1 <= warps <= 32:
                        continue
                    fn = lambda: split_softmax(x, out, block=block, num_warps=warps)  # noqa: E731
                    error = (fn().float() - want).abs().max().item()
                    rows.append({"dtype": dtype, "M": m, "N": n, "KB": kb, "columns_per_thread": per_thread,
                                 "warps": warps, "vs_copy": round(copy / bench.gpu_ms(fn), 3),
                                 "max_abs_error": f"{error:.1e}"})
            del x, out, want
            torch.cuda.empty_cache()
    return pd.DataFrame(rows)


def registers(sizes=(("float32", 1024), ("float32", 16384), ("float32", 65536), ("bfloat16", 16384))) -> pd.DataFrame:
    """Registers per thread and spilled values of softmax_kernel at triton_softmax's launch settings, uncapped and
    with ROW_REGISTER_CAP (course/results/logs/w33_registers_h200.txt, quoted in the day-4 lesson). GPU only."""
    import torch
    from ..registry import kernels
    s, rows = kernels("w33_softmax"), []
    for dtype, n in sizes:
        x = torch.randn(1, n, device="cuda", dtype=getattr(torch, dtype))
        block, size = s.row_block(n), x.element_size()
        for cap in sorted({None, s.ROW_REGISTER_CAP.get((block, size))}, key=str):
            compiled = s.softmax_kernel[(1,)](x, torch.empty_like(x), n, BLOCK=block, maxnreg=cap,
                                              num_warps=s._row_warps(block, size))
            rows.append({"dtype": dtype, "N": n, "maxnreg": cap, "registers": compiled.n_regs,
                         "spilled": compiled.n_spills})
    return pd.DataFrame(rows)
