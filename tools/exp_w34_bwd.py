"""Week-34 backward and forward variants (session 4, second sweep): software-pipelined or prefetched row
loops in the backward, warps and register caps of the forward. Run on a GPU from the repository root:
python3 tools/exp_w34_bwd.py. Each variant is checked against torch before it is timed."""
import torch
import triton
import triton.language as tl

from course import bench
from course.w34_layernorm.reference import norm_cost
from solutions import w34_layernorm as s

SMS = torch.cuda.get_device_properties(0).multi_processor_count


@triton.jit
def bwd_prefetch_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_part_ptr, db_part_ptr,
                        n_rows, n_cols, rows_per_program, BLOCK: tl.constexpr, CENTRED: tl.constexpr,
                        STAGES: tl.constexpr, PREFETCH: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], tl.float32)
    db = tl.zeros([BLOCK], tl.float32)
    first = pid * rows_per_program
    count = tl.minimum(rows_per_program, n_rows - first)
    base = first.to(tl.int64) * n_cols + cols
    x_n = tl.load(x_ptr + base, mask=mask, other=0.0)
    dy_n = tl.load(dy_ptr + base, mask=mask, other=0.0)
    for i in tl.range(0, count, num_stages=STAGES):
        row = first + i
        offsets = row.to(tl.int64) * n_cols + cols
        if PREFETCH:
            x_raw, dy_raw = x_n, dy_n
            nxt = (first + tl.minimum(i + 1, count - 1)).to(tl.int64) * n_cols + cols
            x_n = tl.load(x_ptr + nxt, mask=mask, other=0.0)
            dy_n = tl.load(dy_ptr + nxt, mask=mask, other=0.0)
        else:
            x_raw = tl.load(x_ptr + offsets, mask=mask, other=0.0)
            dy_raw = tl.load(dy_ptr + offsets, mask=mask, other=0.0)
        x = x_raw.to(tl.float32)
        dy = dy_raw.to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        if CENTRED:
            x = x - tl.load(mean_ptr + row)
        xhat = tl.where(mask, x * rstd, 0.0)
        dx = s.normalized_grad(xhat, w * dy, rstd, n_cols, CENTRED)
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
    tl.store(dw_part_ptr + pid * n_cols + cols, dw, mask=mask)
    if CENTRED:
        tl.store(db_part_ptr + pid * n_cols + cols, db, mask=mask)


def run_bwd(x, w, dy, mean, rstd, dx, centred, per_sm, warps, stages, prefetch, maxnreg=None):
    m, n = x.shape
    rows = triton.cdiv(m, min(per_sm * SMS, m))
    parts = torch.empty((2, triton.cdiv(m, rows), n), dtype=torch.float32, device="cuda")
    bwd_prefetch_kernel[(parts.shape[1],)](x, w, dy, mean, rstd, dx, parts[0], parts[1], m, n, rows,
                                           BLOCK=triton.next_power_of_2(n), CENTRED=centred, STAGES=stages,
                                           PREFETCH=prefetch, num_warps=warps, maxnreg=maxnreg)
    return dx, s._sum_parts(parts[0], x), s._sum_parts(parts[1], x) if centred else None


def main():
    for dtype in (torch.bfloat16, torch.float32):
        for m, n in ((4096, 4096), (4096, 8192), (4096, 16384), (32768, 4096)):
            x, dy = (torch.randn(m, n, device="cuda", dtype=dtype) for _ in range(2))
            w, b = 1 + 0.1 * torch.randn(n, device="cuda", dtype=dtype), torch.zeros(n, device="cuda", dtype=dtype)
            _, mean, rstd = s.layernorm(x, w, b)
            _, rrstd = s.rmsnorm(x, w)
            dx = torch.empty_like(x)
            nbytes = norm_cost(m, n, x.element_size(), "backward")["bytes"]
            line = []
            for centred in (True, False):
                want = s.norm_backward(x, w, dy, mean if centred else None, rstd if centred else rrstd)
                line.append(f"{'ln' if centred else 'rms'} now {nbytes / bench.gpu_ms(lambda: s.norm_backward(x, w, dy, mean if centred else None, rstd if centred else rrstd), rep_ms=40) / 1e6:.0f}")
                for per_sm in (1, 2):
                    for warps in (4, 8, 16):
                        for stages, prefetch in ((1, True), (2, False), (3, False)):
                            args = (x, w, dy, mean, rstd if centred else rrstd, dx, centred, per_sm, warps, stages, prefetch)
                            try:
                                got = run_bwd(*args)
                                err = max((g.float() - e.float()).abs().max().item() for g, e in zip(got, want) if g is not None)
                                assert err < 0.1 * max(1.0, want[1].float().abs().max().item()), err
                                ms = bench.gpu_ms(lambda: run_bwd(*args), rep_ms=40)
                                line.append(f"{'ln' if centred else 'rms'} {per_sm}/SM w{warps} s{stages}{'p' if prefetch else ''} {nbytes / ms / 1e6:.0f}")
                            except Exception as exc:
                                line.append(f"{per_sm}/SM w{warps} s{stages} FAIL {type(exc).__name__} {str(exc)[:60]}")
            print(dtype, m, n, " | ".join(line), flush=True)
            out = torch.empty_like(x)
            block = triton.next_power_of_2(n)
            fline = []
            for warps in (4, 8, 16):
                for reg in (None, 32, 40, 48):
                    for name, fn in (("ln", lambda: s.layernorm_kernel[(m,)](x, w, b, out, mean, rstd, n, 1e-5, BLOCK=block, COMPUTE=tl.float32, num_warps=warps, maxnreg=reg)),
                                     ("rms", lambda: s.rmsnorm_kernel[(m,)](x, w, out, rstd, n, 1e-5, BLOCK=block, COMPUTE=tl.float32, num_warps=warps, maxnreg=reg))):
                        ms = bench.gpu_ms(fn, rep_ms=40)
                        fline.append(f"{name} w{warps} r{reg} {norm_cost(m, n, x.element_size(), 'forward')['bytes'] / ms / 1e6:.0f}")
            print(dtype, m, n, "FWD", " | ".join(fline), flush=True)


if __name__ == "__main__":
    main()
