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
        "copy": ("forward", "F.layer_norm", lambda: out.copy_(x)),
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
