"""Week 34 benchmark: forward and backward of both norms and the fused residual add + RMSNorm, course
kernels vs torch (F.layer_norm, F.rms_norm, their autograd backward, eager add + rms_norm) and the copy
ceiling, fp32 and bf16, one run, two times each (the kernel alone and the per-call time a user sees:
course/bench.py), with QuACK, Liger-Kernel and torch.compile beside them (course/peers.py). Bytes come from the
cost model (reference.norm_cost)."""
import math

import pandas as pd
from tqdm.auto import tqdm

from .. import bench, peers
from .reference import norm_cost

SIZES = ((4096, 1024), (4096, 4096), (4096, 8192), (4096, 16384), (32768, 4096))
DTYPES = ("float32", "bfloat16")


def cases(x, w, b, dy, r):
    """{kernel: (stage, peer, fn)}: each course kernel names the torch op it is compared with."""
    import torch
    import torch.nn.functional as F
    from ..registry import kernels
    s = kernels("w34_layernorm")
    n = x.shape[-1]
    _, mean, rstd = s.layernorm(x, w, b)
    _, rms_rstd = s.rmsnorm(x, w)
    xg, wg, bg = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y_ln, y_rms = F.layer_norm(xg, (n,), wg, bg), F.rms_norm(xg, (n,), wg, eps=1e-5)
    out = torch.empty_like(x)
    return {
        "layernorm": ("forward", "F.layer_norm", lambda: s.layernorm(x, w, b, out)),
        "cuda_layernorm": ("forward", "F.layer_norm", lambda: s.cuda_layernorm(x, w, b, out)),
        "F.layer_norm": ("forward", "F.layer_norm", lambda: F.layer_norm(x, (n,), w, b)),
        "rmsnorm": ("forward", "F.rms_norm", lambda: s.rmsnorm(x, w, out)),
        "F.rms_norm": ("forward", "F.rms_norm", lambda: F.rms_norm(x, (n,), w, eps=1e-5)),
        "copy": ("forward", "F.layer_norm", bench.copier(x, out)),
        "layernorm_backward": ("backward", "torch layer_norm backward", lambda: s.norm_backward(x, w, dy, mean, rstd)),
        "torch layer_norm backward": ("backward", "torch layer_norm backward",
                                      lambda: torch.autograd.grad(y_ln, (xg, wg, bg), dy, retain_graph=True)),
        "rmsnorm_backward": ("backward", "torch rms_norm backward", lambda: s.norm_backward(x, w, dy, None, rms_rstd)),
        "torch rms_norm backward": ("backward", "torch rms_norm backward",
                                    lambda: torch.autograd.grad(y_rms, (xg, wg), dy, retain_graph=True)),
        "fused_add_rmsnorm": ("fused", "torch add + F.rms_norm", lambda: s.fused_add_rmsnorm(x, r, w, out)),
        "torch add + F.rms_norm": ("fused", "torch add + F.rms_norm", lambda: F.rms_norm(x + r, (n,), w, eps=1e-5)),
        **{name: ("forward", TORCH[course], fn) for name, (course, fn) in peers.norms_forward(x, w, b).items()},
        **{name: ("backward", TORCH[course], fn) for name, (course, fn) in peers.norms_backward(x, w, b, dy).items()},
        **{name: ("fused", TORCH["fused_add_rmsnorm"], fn) for name, fn in peers.fused_add_rmsnorm(x, r, w).items()},
    }


TORCH = {"layernorm": "F.layer_norm", "rmsnorm": "F.rms_norm", "layernorm_backward": "torch layer_norm backward",
         "rmsnorm_backward": "torch rms_norm backward", "fused_add_rmsnorm": "torch add + F.rms_norm"}
# each course kernel's peer in each library (the torch one is the row's "peer" column)
LIBRARIES = {"quack": {"layernorm": "quack layernorm", "rmsnorm": "quack rmsnorm",
                       "layernorm_backward": "quack layernorm backward", "rmsnorm_backward": "quack rmsnorm backward",
                       "fused_add_rmsnorm": "quack add+rmsnorm"},
             "liger": {"layernorm": "liger layernorm", "rmsnorm": "liger rmsnorm",
                       "layernorm_backward": "liger layernorm backward", "rmsnorm_backward": "liger rmsnorm backward",
                       "fused_add_rmsnorm": "liger add+rmsnorm"},
             "compile": {"layernorm": "torch.compile layer_norm", "rmsnorm": "torch.compile rms_norm",
                         "layernorm_backward": "torch.compile layer_norm backward",
                         "rmsnorm_backward": "torch.compile rms_norm backward",
                         "fused_add_rmsnorm": "torch.compile add+rms_norm"}}


def run() -> pd.DataFrame:
    import torch
    ceiling = bench.copy_ceiling_gbps()
    matmul = bench.matmul_ceiling_tflops()
    rows = bench.Rows()
    for dtype, (m, n) in tqdm([(d, s) for d in DTYPES for s in SIZES], desc="w34 norms"):
        dt = getattr(torch, dtype)
        size = torch.tensor([], dtype=dt).element_size()
        why = bench.fits(12 * m * n * size)  # x, dy, r, out, torch's outputs and gradients
        if why:
            rows.append({"kernel": "all", "dtype": dtype, "M": m, "N": n, "ms": math.nan, "note": why})
            continue
        x, dy, r = (torch.randn(m, n, device="cuda", dtype=dt) for _ in range(3))
        w, b = (1 + 0.1 * torch.randn(n, device="cuda", dtype=dt)), 0.1 * torch.randn(n, device="cuda", dtype=dt)
        for name, (stage, peer, fn) in cases(x, w, b, dy, r).items():
            times = bench.timed(fn)
            rows.append({"stage": stage, "kernel": name, "peer": peer, "dtype": dtype, "M": m, "N": n,
                         **bench.rates(times, norm_cost(m, n, size, stage)["bytes"], ceiling),
                         "copy_ceiling_GB/s": round(ceiling, 1), "matmul_ceiling_TFLOP/s": round(matmul, 1)})
        del x, dy, r
    table = bench.versus(pd.DataFrame(rows), lambda r: (r["peer"], r["dtype"], r["M"], r["N"]),
                         ["kernel", "dtype", "M", "N"], "vs_torch")
    for library, peer in LIBRARIES.items():
        table = bench.versus(table, lambda r: (peer.get(r["kernel"]), r["dtype"], r["M"], r["N"]),
                             ["kernel", "dtype", "M", "N"], f"vs_{library}")
    return table


def tune_rows(sizes=SIZES, dtypes=DTYPES, warps=(2, 4, 8, 16, 32), per_sm=(1, 2, 4)) -> pd.DataFrame:
    """GB/s of the forward row kernels at each num_warps and of layernorm_loop_kernel at each programs per SM
    (3 stages, 8 warps): how _row_launch's warps and layernorm's loop for long rows were chosen. GPU only."""
    import torch
    import triton
    import triton.language as tl
    from ..registry import kernels
    s, rows = kernels("w34_layernorm"), []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for dtype in dtypes:
        for m, n in sizes:
            x, r = (torch.randn(m, n, device="cuda", dtype=getattr(torch, dtype)) for _ in range(2))
            w, b = torch.ones_like(x[0]), torch.zeros_like(x[0])
            y, h = torch.empty_like(x), torch.empty_like(x)
            mean, rstd = (torch.empty(m, device="cuda") for _ in range(2))
            meta = {"BLOCK": triton.next_power_of_2(n), "COMPUTE": tl.float32}
            runs = {(k, f"{p} warps"): (lambda k=k, a=a, p=p: getattr(s, k)[(m,)](*a, n, 1e-5, **meta, num_warps=p))
                    for p in warps for k, a in (("layernorm_kernel", (x, w, b, y, mean, rstd)),
                                                ("rmsnorm_kernel", (x, w, y, rstd)),
                                                ("fused_add_rmsnorm_kernel", (x, r, w, y, h)))}
            runs.update({("layernorm_loop_kernel", f"{p} programs/SM"):
                         lambda p=p: s.layernorm_loop_kernel[(min(p * sms, m),)](
                             x, w, b, y, mean, rstd, m, n, 1e-5, **meta, STAGES=3, num_warps=8) for p in per_sm})
            for (kernel, setting), fn in runs.items():
                ms, why = bench.attempt_ms(fn)
                stage = "fused" if kernel.startswith("fused") else "forward"
                nbytes = norm_cost(m, n, x.element_size(), stage)["bytes"]
                rows.append({"dtype": dtype, "M": m, "N": n, "kernel": kernel, "setting": setting,
                             "GB/s": nbytes / ms / 1e6, "note": why})
            del x, r, y, h
            torch.cuda.empty_cache()
    return pd.DataFrame(rows).round({"GB/s": 0})


def tune_weight_grad(widths=(1024, 4096, 8192, 16384), per_sm=(1, 2), cols=(16, 32, 64, 128, 256)) -> pd.DataFrame:
    """µs of weight_grad_kernel (stage 2 of the backward) at each columns per program, summing per_sm · SMs float32
    partial rows of LayerNorm's width 2N: how SUM_COLS was chosen (the day-6 lesson). GPU only."""
    import torch
    import triton
    from ..registry import kernels
    s, rows = kernels("w34_layernorm"), []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n in widths:
        for p in per_sm:
            parts = torch.randn(p * sms, 2 * n, device="cuda")
            out = torch.empty(2 * n, device="cuda", dtype=torch.bfloat16)
            for c in cols:
                ms = bench.gpu_ms(lambda c=c: s.weight_grad_kernel[(triton.cdiv(2 * n, c),)](
                    parts, out, p * sms, 2 * n, BLOCK_P=32, BLOCK_N=c, num_warps=4))
                rows.append({"N": n, "parts": p * sms, "cols_per_program": c, "us": round(1e3 * ms, 1)})
    return pd.DataFrame(rows)
