"""Week-34 backward for long rows (session 4): w reloaded per row instead of held, and the dγ/dβ partial
rows accumulated in registers or read-modify-written through L2. Run on a GPU from the repository root:
python3 tools/exp_w34_long.py. Each variant is checked against the course's backward before it is timed."""
import torch
import triton
import triton.language as tl

from course import bench
from course.w34_layernorm.reference import norm_cost
from solutions import w34_layernorm as s

SMS = torch.cuda.get_device_properties(0).multi_processor_count


@triton.jit
def bwd_long_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_part_ptr, db_part_ptr,
                    n_rows, n_cols, rows_per_program, BLOCK: tl.constexpr, CENTRED: tl.constexpr,
                    ACC_MEM: tl.constexpr, HOLD_W: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if HOLD_W:
        w_held = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], tl.float32)
    db = tl.zeros([BLOCK], tl.float32)
    if ACC_MEM:
        tl.store(dw_part_ptr + pid * n_cols + cols, dw, mask=mask)
        if CENTRED:
            tl.store(db_part_ptr + pid * n_cols + cols, db, mask=mask)
    first = pid * rows_per_program
    for i in range(0, tl.minimum(rows_per_program, n_rows - first)):
        row = first + i
        offsets = row.to(tl.int64) * n_cols + cols
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if HOLD_W:
            w = w_held
        else:
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        if CENTRED:
            x = x - tl.load(mean_ptr + row)
        xhat = tl.where(mask, x * rstd, 0.0)
        dx = s.normalized_grad(xhat, w * dy, rstd, n_cols, CENTRED)
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if ACC_MEM:
            part = dw_part_ptr + pid * n_cols + cols
            tl.store(part, tl.load(part, mask=mask, other=0.0) + dy * xhat, mask=mask)
            if CENTRED:
                part_b = db_part_ptr + pid * n_cols + cols
                tl.store(part_b, tl.load(part_b, mask=mask, other=0.0) + dy, mask=mask)
        else:
            dw += dy * xhat
            db += dy
    if not ACC_MEM:
        tl.store(dw_part_ptr + pid * n_cols + cols, dw, mask=mask)
        if CENTRED:
            tl.store(db_part_ptr + pid * n_cols + cols, db, mask=mask)


def run(x, w, dy, mean, rstd, dx, centred, per_sm, warps, acc_mem, hold_w):
    m, n = x.shape
    rows = triton.cdiv(m, min(per_sm * SMS, m))
    parts = torch.empty((2, triton.cdiv(m, rows), n), dtype=torch.float32, device="cuda")
    k = bwd_long_kernel[(parts.shape[1],)](x, w, dy, mean, rstd, dx, parts[0], parts[1], m, n, rows,
                                           BLOCK=triton.next_power_of_2(n), CENTRED=centred, ACC_MEM=acc_mem,
                                           HOLD_W=hold_w, num_warps=warps)
    return (dx, s._sum_parts(parts[0], x), s._sum_parts(parts[1], x) if centred else None), k


def main():
    for dtype in (torch.bfloat16, torch.float32):
        for m, n in ((4096, 16384), (4096, 8192)):
            x, dy = (torch.randn(m, n, device="cuda", dtype=dtype) for _ in range(2))
            w, b = 1 + 0.1 * torch.randn(n, device="cuda", dtype=dtype), torch.zeros(n, device="cuda", dtype=dtype)
            _, mean, rstd = s.layernorm(x, w, b)
            _, rrstd = s.rmsnorm(x, w)
            dx = torch.empty_like(x)
            nbytes = norm_cost(m, n, x.element_size(), "backward")["bytes"]
            for centred in (True, False):
                st = rstd if centred else rrstd
                mu = mean if centred else None
                want = s.norm_backward(x, w, dy, mu, st)
                line = [f"now {nbytes / bench.gpu_ms(lambda: s.norm_backward(x, w, dy, mu, st), rep_ms=40) / 1e6:.0f}"]
                for per_sm in (1, 2):
                    for warps in (8, 16, 32):
                        for acc_mem in (False, True):
                            for hold_w in (True, False):
                                args = (x, w, dy, mean, st, dx, centred, per_sm, warps, acc_mem, hold_w)
                                tag = f"{per_sm}/SM w{warps}{' mem' if acc_mem else ''}{' hold' if hold_w else ''}"
                                try:
                                    got, k = run(*args)
                                    err = max((g.float() - e.float()).abs().max().item()
                                              for g, e in zip(got, want) if g is not None)
                                    scale = max(1.0, want[1].float().abs().max().item())
                                    assert err < 0.05 * scale, err
                                    ms = bench.gpu_ms(lambda: run(*args), rep_ms=40)
                                    line.append(f"{tag} {nbytes / ms / 1e6:.0f} (r{k.n_regs} s{k.n_spills})")
                                except Exception as exc:
                                    line.append(f"{tag} FAIL {type(exc).__name__} {str(exc)[:50]}")
                print(dtype, m, n, "ln" if centred else "rms", " | ".join(line), flush=True)


if __name__ == "__main__":
    main()
