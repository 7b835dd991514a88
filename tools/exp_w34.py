"""Week-34 launch-parameter sweep (session 4): warps of the row kernels, programs and warps of the backward.
Run on a GPU from the repository root: python3 tools/exp_w34.py. Prints GB/s per setting (bf16 and fp32)."""
import torch
import triton

from course import bench
from course.w34_layernorm.reference import norm_cost
from solutions import w34_layernorm as s

SMS = torch.cuda.get_device_properties(0).multi_processor_count
for dtype in (torch.bfloat16, torch.float32):
    for m, n in ((4096, 4096), (4096, 8192), (4096, 16384), (32768, 4096)):
        x, dy, r = (torch.randn(m, n, device="cuda", dtype=dtype) for _ in range(3))
        w, b = torch.ones(n, device="cuda", dtype=dtype), torch.zeros(n, device="cuda", dtype=dtype)
        out = torch.empty_like(x)
        _, mean, rstd = s.layernorm(x, w, b)
        block = triton.next_power_of_2(n)
        line = []
        for warps in (2, 4, 8, 16, 32):
            for name, fn in (("ln", lambda: s.layernorm_kernel[(m,)](x, w, b, out, mean, rstd, n, 1e-5, BLOCK=block,
                                                                    COMPUTE=s.tl.float32, num_warps=warps)),
                             ("rms", lambda: s.rmsnorm_kernel[(m,)](x, w, out, rstd, n, 1e-5, BLOCK=block,
                                                                   COMPUTE=s.tl.float32, num_warps=warps)),
                             ("fused", lambda: s.fused_add_rmsnorm_kernel[(m,)](x, r, w, out, dy, n, 1e-5, BLOCK=block,
                                                                               COMPUTE=s.tl.float32, num_warps=warps))):
                ms = bench.gpu_ms(fn, rep_ms=50)
                line.append(f"{name} w{warps} {norm_cost(m, n, x.element_size(), 'fused' if name == 'fused' else 'forward')['bytes'] / ms / 1e6:.0f}")
        print(dtype, m, n, " | ".join(line), flush=True)
        line = []
        for per_sm in (1, 2, 4, 8, 16):
            for warps in (4, 8, 16):
                if block // (warps * 32) < 1:
                    continue
                def fn():
                    programs = per_sm * SMS
                    rows = triton.cdiv(m, min(programs, m))
                    parts = torch.empty((triton.cdiv(m, rows), 2 * n), dtype=torch.float32, device="cuda")
                    s.norm_backward_kernel[(parts.shape[0],)](x, w, dy, mean, rstd, out, parts, m, n, rows, 2 * n,
                                                             BLOCK=block, CENTRED=True, COMPUTE=s.tl.float32, STAGES=1, WANT_DX=True,
                                                             num_warps=warps)
                    s._sum_parts(parts, x)
                ms = bench.gpu_ms(fn, rep_ms=50)
                line.append(f"bwd {per_sm}/SM w{warps} {norm_cost(m, n, x.element_size(), 'backward')['bytes'] / ms / 1e6:.0f}")
        print(dtype, m, n, " | ".join(line), flush=True)
