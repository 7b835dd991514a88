"""Week-34 experiments (session 5), run on a GPU from the repository root: python3 tools/exp_w34_s5.py [part...]
Parts: copy (the same-size copy ceiling with Triton copies), fwd (row loop persistent and pipelined, eviction
hints, two rows per program), bwd (long-row backward with dγ/dβ accumulated per column chunk).
Every variant is checked against the course kernel before it is timed."""
import sys

import torch
import triton
import triton.language as tl

from course import bench
from course.w34_layernorm.reference import norm_cost
from solutions import w34_layernorm as s

DEV = "cuda"
SMS = torch.cuda.get_device_properties(0).multi_processor_count
SHAPES = ((4096, 4096), (4096, 8192), (4096, 16384), (32768, 4096))


def gbps(nbytes, fn):
    return nbytes / bench.gpu_ms(fn, rep_ms=40) / 1e6


# ------------------------------------------------------------------ copies of the same size
@triton.jit
def copy_rows(x_ptr, y_ptr, n_rows, n_cols, BLOCK: tl.constexpr, STAGES: tl.constexpr, PERSIST: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if PERSIST:
        for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
            offs = row * n_cols + cols  # < 2**31 for the shapes here
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)
    else:
        offs = tl.program_id(0).to(tl.int64) * n_cols + cols
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def part_copy(ceiling):
    for m, n in SHAPES:
        x = torch.randn(m, n, device=DEV, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        nb = 2 * x.numel() * 2
        line = [f"torch {gbps(nb, lambda: y.copy_(x)) / ceiling:.3f}"]
        for warps in (4, 8, 16):
            line.append(f"row w{warps} {gbps(nb, lambda: copy_rows[(m,)](x, y, m, n, BLOCK=n, STAGES=1, PERSIST=False, num_warps=warps)) / ceiling:.3f}")
            for per_sm in (1, 2, 4):
                for st in (2, 3):
                    line.append(f"pers{per_sm} w{warps} st{st} {gbps(nb, lambda: copy_rows[(per_sm * SMS,)](x, y, m, n, BLOCK=n, STAGES=st, PERSIST=True, num_warps=warps)) / ceiling:.3f}")
        assert torch.equal(x, y)
        print("copy", m, n, " | ".join(line), flush=True)


# ------------------------------------------------------------------ forward variants
@triton.jit
def ln_fwd(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_rows, n_cols, eps, BLOCK: tl.constexpr,
           RMS: tl.constexpr, PERSIST: tl.constexpr, STAGES: tl.constexpr, EVICT: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if not RMS:
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    start = tl.program_id(0)
    step = tl.num_programs(0) if PERSIST else n_rows
    for row in tl.range(start, n_rows, step, num_stages=STAGES):
        offs = row * n_cols + cols  # < 2**31 for the shapes here
        if EVICT:
            x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        else:
            x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if RMS:
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
            y = x * rstd * w
        else:
            mean = tl.sum(x, axis=0) / n_cols
            c = tl.where(mask, x - mean, 0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(c * c, axis=0) / n_cols + eps)
            y = c * rstd * w + b
            tl.store(mean_ptr + row, mean)
        if EVICT:
            tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask, cache_modifier=".cs")
        else:
            tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(rstd_ptr + row, rstd)


@triton.jit
def ln_fwd2(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_rows, n_cols, eps, BLOCK: tl.constexpr,
            ROWS: tl.constexpr, RMS: tl.constexpr):
    # ROWS rows per program as one [ROWS, BLOCK] tile
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    if RMS:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)
        y = x * rstd[:, None] * w[None, :]
    else:
        b = tl.load(b_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / n_cols
        c = tl.where(mask, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(c * c, axis=1) / n_cols + eps)
        y = c * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(mean_ptr + rows, mean, mask=rows < n_rows)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + rows, rstd, mask=rows < n_rows)


@triton.jit
def fused_fwd(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, n_rows, n_cols, eps, BLOCK: tl.constexpr, PERSIST: tl.constexpr,
              STAGES: tl.constexpr, EVICT: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    step = tl.num_programs(0) if PERSIST else n_rows
    for row in tl.range(tl.program_id(0), n_rows, step, num_stages=STAGES):
        offs = row * n_cols + cols  # < 2**31 for the shapes here
        if EVICT:
            x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first")
            r = tl.load(r_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first")
        else:
            x = tl.load(x_ptr + offs, mask=mask, other=0.0)
            r = tl.load(r_ptr + offs, mask=mask, other=0.0)
        h = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
        hf = h.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / n_cols + eps)
        if EVICT:
            tl.store(h_ptr + offs, h, mask=mask, cache_modifier=".cs")
            tl.store(y_ptr + offs, (hf * rstd * w).to(y_ptr.dtype.element_ty), mask=mask, cache_modifier=".cs")
        else:
            tl.store(h_ptr + offs, h, mask=mask)
            tl.store(y_ptr + offs, (hf * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def part_fwd(ceiling):
    for m, n in SHAPES:
        x, r = (torch.randn(m, n, device=DEV, dtype=torch.bfloat16) for _ in range(2))
        w, b = 1 + 0.1 * torch.randn(n, device=DEV, dtype=torch.bfloat16), 0.1 * torch.randn(n, device=DEV, dtype=torch.bfloat16)
        y, h = torch.empty_like(x), torch.empty_like(x)
        mean, rstd = (torch.empty(m, device=DEV) for _ in range(2))
        nb = norm_cost(m, n, 2, "forward")["bytes"]
        nbf = norm_cost(m, n, 2, "fused")["bytes"]
        want_ln, want_rms = s.layernorm(x, w, b)[0], s.rmsnorm(x, w)[0]
        want_fy, want_fh = s.fused_add_rmsnorm(x, r, w)
        for rms in (False, True):
            want = want_rms if rms else want_ln
            line = [f"now {gbps(nb, (lambda: s.rmsnorm(x, w, y)) if rms else (lambda: s.layernorm(x, w, b, y))) / ceiling:.3f}",
                    f"torch {gbps(nb, (lambda: torch.nn.functional.rms_norm(x, (n,), w, 1e-5)) if rms else (lambda: torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5))) / ceiling:.3f}"]
            for warps in (4, 8, 16):
                for persist, per_sm, st in ((False, 0, 1), (True, 1, 2), (True, 2, 2), (True, 4, 2), (True, 2, 3), (True, 4, 1), (True, 8, 1)):
                    for evict in (False, True):
                        grid = (per_sm * SMS,) if persist else (m,)
                        fn = lambda: ln_fwd[grid](x, w, b, y, mean, rstd, m, n, 1e-5, BLOCK=n, RMS=rms, PERSIST=persist, STAGES=st, EVICT=evict, num_warps=warps)
                        tag = f"w{warps} {'p%d st%d' % (per_sm, st) if persist else 'row'}{' ev' if evict else ''}"
                        try:
                            fn()
                            assert (y.float() - want.float()).abs().max().item() < 0.05
                            line.append(f"{tag} {gbps(nb, fn) / ceiling:.3f}")
                        except Exception as exc:
                            line.append(f"{tag} FAIL {type(exc).__name__}")
                for rows in (2, 4):
                    fn = lambda: ln_fwd2[(triton.cdiv(m, rows),)](x, w, b, y, mean, rstd, m, n, 1e-5, BLOCK=n, ROWS=rows, RMS=rms, num_warps=warps)
                    try:
                        fn()
                        assert (y.float() - want.float()).abs().max().item() < 0.05
                        line.append(f"w{warps} rows{rows} {gbps(nb, fn) / ceiling:.3f}")
                    except Exception as exc:
                        line.append(f"w{warps} rows{rows} FAIL {type(exc).__name__}")
            print("rms" if rms else "ln", m, n, " | ".join(line), flush=True)
        line = [f"now {gbps(nbf, lambda: s.fused_add_rmsnorm(x, r, w, y)) / ceiling:.3f}"]
        for warps in (4, 8, 16):
            for persist, per_sm, st in ((False, 0, 1), (True, 1, 2), (True, 2, 2), (True, 4, 2), (True, 2, 3)):
                for evict in (False, True):
                    grid = (per_sm * SMS,) if persist else (m,)
                    fn = lambda: fused_fwd[grid](x, r, w, y, h, m, n, 1e-5, BLOCK=n, PERSIST=persist, STAGES=st, EVICT=evict, num_warps=warps)
                    tag = f"w{warps} {'p%d st%d' % (per_sm, st) if persist else 'row'}{' ev' if evict else ''}"
                    try:
                        fn()
                        assert (y.float() - want_fy.float()).abs().max().item() < 0.05 and torch.equal(h, want_fh)
                        line.append(f"{tag} {gbps(nbf, fn) / ceiling:.3f}")
                    except Exception as exc:
                        line.append(f"{tag} FAIL {type(exc).__name__}")
        print("fused", m, n, " | ".join(line), flush=True)


# ------------------------------------------------------------------ backward of long rows, chunked accumulators
@triton.jit
def _pass1(x_ptr, dy_ptr, w_ptr, base, c, n_cols, mean, rstd, KEEP: tl.constexpr):
    mask = c < n_cols
    if KEEP:
        x = tl.load(x_ptr + base + c, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        dy = tl.load(dy_ptr + base + c, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    else:
        x = tl.load(x_ptr + base + c, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + base + c, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    wdy = w * dy
    return tl.sum(xhat * wdy, axis=0), tl.sum(wdy, axis=0), dy * xhat, dy


@triton.jit
def _pass2(x_ptr, dy_ptr, w_ptr, dx_ptr, base, c, n_cols, mean, rstd, c1, c2, KEEP: tl.constexpr):
    mask = c < n_cols
    if KEEP:
        x = tl.load(x_ptr + base + c, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        dy = tl.load(dy_ptr + base + c, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    else:
        x = tl.load(x_ptr + base + c, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + base + c, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
    xhat = (x - mean) * rstd
    dx = (w * dy - (xhat * c1 + c2)) * rstd
    tl.store(dx_ptr + base + c, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def bwd_chunked(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_part_ptr, db_part_ptr, n_rows, n_cols,
                rows_per_program, CW: tl.constexpr, NCHUNK: tl.constexpr, CENTRED: tl.constexpr,
                STAGES: tl.constexpr, KEEP: tl.constexpr):
    # program p owns a run of rows; per row: pass 1 over the chunks (row sums, dγ/dβ per chunk), pass 2 over
    # the chunks again (x, dy re-read from L1/L2, last chunk first) for dx. Chunked accumulators fit registers.
    pid = tl.program_id(0)
    c = tl.arange(0, CW)
    g0 = tl.zeros([CW], tl.float32)
    g1 = tl.zeros([CW], tl.float32)
    g2 = tl.zeros([CW], tl.float32)
    g3 = tl.zeros([CW], tl.float32)
    b0 = tl.zeros([CW], tl.float32)
    b1 = tl.zeros([CW], tl.float32)
    b2 = tl.zeros([CW], tl.float32)
    b3 = tl.zeros([CW], tl.float32)
    first = pid * rows_per_program
    for i in tl.range(0, tl.minimum(rows_per_program, n_rows - first), num_stages=STAGES):
        row = first + i
        base = row.to(tl.int64) * n_cols
        rstd = tl.load(rstd_ptr + row)
        mean = tl.load(mean_ptr + row) if CENTRED else 0.0
        s1, s2, g, bb = _pass1(x_ptr, dy_ptr, w_ptr, base, c, n_cols, mean, rstd, KEEP)
        g0 += g
        b0 += bb
        t1, t2, g, bb = _pass1(x_ptr, dy_ptr, w_ptr, base, c + CW, n_cols, mean, rstd, KEEP)
        g1 += g
        b1 += bb
        s1 += t1
        s2 += t2
        if NCHUNK == 4:
            t1, t2, g, bb = _pass1(x_ptr, dy_ptr, w_ptr, base, c + 2 * CW, n_cols, mean, rstd, KEEP)
            g2 += g
            b2 += bb
            s1 += t1
            s2 += t2
            t1, t2, g, bb = _pass1(x_ptr, dy_ptr, w_ptr, base, c + 3 * CW, n_cols, mean, rstd, KEEP)
            g3 += g
            b3 += bb
            s1 += t1
            s2 += t2
        c1 = s1 / n_cols
        c2 = s2 / n_cols if CENTRED else 0.0
        if NCHUNK == 4:
            _pass2(x_ptr, dy_ptr, w_ptr, dx_ptr, base, c + 3 * CW, n_cols, mean, rstd, c1, c2, KEEP)
            _pass2(x_ptr, dy_ptr, w_ptr, dx_ptr, base, c + 2 * CW, n_cols, mean, rstd, c1, c2, KEEP)
        _pass2(x_ptr, dy_ptr, w_ptr, dx_ptr, base, c + CW, n_cols, mean, rstd, c1, c2, KEEP)
        _pass2(x_ptr, dy_ptr, w_ptr, dx_ptr, base, c, n_cols, mean, rstd, c1, c2, KEEP)
    out = pid * n_cols + c
    tl.store(dw_part_ptr + out, g0, mask=c < n_cols)
    tl.store(dw_part_ptr + out + CW, g1, mask=c + CW < n_cols)
    if NCHUNK == 4:
        tl.store(dw_part_ptr + out + 2 * CW, g2, mask=c + 2 * CW < n_cols)
        tl.store(dw_part_ptr + out + 3 * CW, g3, mask=c + 3 * CW < n_cols)
    if CENTRED:
        tl.store(db_part_ptr + out, b0, mask=c < n_cols)
        tl.store(db_part_ptr + out + CW, b1, mask=c + CW < n_cols)
        if NCHUNK == 4:
            tl.store(db_part_ptr + out + 2 * CW, b2, mask=c + 2 * CW < n_cols)
            tl.store(db_part_ptr + out + 3 * CW, b3, mask=c + 3 * CW < n_cols)


def run_chunked(x, w, dy, mean, rstd, dx, centred, per_sm, warps, nchunk, stages, keep):
    m, n = x.shape
    rows = triton.cdiv(m, min(per_sm * SMS, m))
    parts = torch.empty((2, triton.cdiv(m, rows), n), dtype=torch.float32, device=DEV)
    k = bwd_chunked[(parts.shape[1],)](x, w, dy, mean if centred else rstd, rstd, dx, parts[0], parts[1], m, n, rows,
                                       CW=triton.next_power_of_2(n) // nchunk, NCHUNK=nchunk, CENTRED=centred,
                                       STAGES=stages, KEEP=keep, num_warps=warps)
    return (dx, s._sum_parts(parts[0], x), s._sum_parts(parts[1], x) if centred else None), k


@triton.jit
def _add2(a1, a2, b1, b2):
    return a1 + b1, a2 + b2


@triton.jit
def bwd_chunked2(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_part_ptr, db_part_ptr, n_rows, n_cols,
                 rows_per_program, CW: tl.constexpr, CENTRED: tl.constexpr, NO_DB: tl.constexpr):
    # two chunks; the row sums of both chunks reduced together in one tl.reduce (one barrier round);
    # NO_DB leaves dβ to another kernel (one accumulator fewer)
    pid = tl.program_id(0)
    c = tl.arange(0, CW)
    g0 = tl.zeros([CW], tl.float32)
    g1 = tl.zeros([CW], tl.float32)
    b0 = tl.zeros([CW], tl.float32)
    b1 = tl.zeros([CW], tl.float32)
    first = pid * rows_per_program
    for i in range(0, tl.minimum(rows_per_program, n_rows - first)):
        row = first + i
        base = row.to(tl.int64) * n_cols
        rstd = tl.load(rstd_ptr + row)
        mean = tl.load(mean_ptr + row) if CENTRED else 0.0
        m0 = c < n_cols
        x = tl.load(x_ptr + base + c, mask=m0, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + base + c, mask=m0, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + c, mask=m0, other=0.0).to(tl.float32)
        xhat = tl.where(m0, (x - mean) * rstd, 0.0)
        v1 = xhat * w * dy
        v2 = w * dy
        g0 += dy * xhat
        if not NO_DB:
            b0 += dy
        m1 = c + CW < n_cols
        x = tl.load(x_ptr + base + CW + c, mask=m1, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + base + CW + c, mask=m1, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + CW + c, mask=m1, other=0.0).to(tl.float32)
        xhat = tl.where(m1, (x - mean) * rstd, 0.0)
        v1 += xhat * w * dy
        v2 += w * dy
        g1 += dy * xhat
        if not NO_DB:
            b1 += dy
        if CENTRED:
            s1, s2 = tl.reduce((v1, v2), 0, _add2)
            c2 = s2 / n_cols
        else:
            s1 = tl.sum(v1, axis=0)
            c2 = 0.0
        c1 = s1 / n_cols
        dx = (w * dy - (xhat * c1 + c2)) * rstd
        tl.store(dx_ptr + base + CW + c, dx.to(dx_ptr.dtype.element_ty), mask=m1)
        _pass2(x_ptr, dy_ptr, w_ptr, dx_ptr, base, c, n_cols, mean, rstd, c1, c2, False)
    out = pid * n_cols + c
    tl.store(dw_part_ptr + out, g0, mask=c < n_cols)
    tl.store(dw_part_ptr + out + CW, g1, mask=c + CW < n_cols)
    if CENTRED and not NO_DB:
        tl.store(db_part_ptr + out, b0, mask=c < n_cols)
        tl.store(db_part_ptr + out + CW, b1, mask=c + CW < n_cols)


@triton.jit
def dx_only(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, n_rows, n_cols, BLOCK: tl.constexpr,
            CENTRED: tl.constexpr, STAGES: tl.constexpr, PERSIST: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    step = tl.num_programs(0) if PERSIST else n_rows
    for row in tl.range(tl.program_id(0), n_rows, step, num_stages=STAGES):
        offs = row * n_cols + cols  # < 2**31 for the shapes here
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        if CENTRED:
            x = x - tl.load(mean_ptr + row)
        xhat = tl.where(mask, x * rstd, 0.0)
        dx = s.normalized_grad(xhat, w * dy, rstd, n_cols, CENTRED)
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def dgb_cols(x_ptr, dy_ptr, mean_ptr, rstd_ptr, dw_part_ptr, db_part_ptr, n_rows, n_cols, rows_per_split,
             RB: tl.constexpr, CB: tl.constexpr, CENTRED: tl.constexpr, ONLY_DB: tl.constexpr, STAGES: tl.constexpr):
    # program (j, k): columns [j·CB, j·CB + CB) over rows [k·R, k·R + R), RB rows at a time; one partial row each
    cols = tl.program_id(0) * CB + tl.arange(0, CB)
    first = tl.program_id(1) * rows_per_split
    last = tl.minimum(first + rows_per_split, n_rows)
    g = tl.zeros([CB], tl.float32)
    b = tl.zeros([CB], tl.float32)
    for r0 in tl.range(first, last, RB, num_stages=STAGES):
        rows = r0 + tl.arange(0, RB)
        rm = rows < last
        mask = rm[:, None] & (cols[None, :] < n_cols)
        offs = rows[:, None] * n_cols + cols[None, :]
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        b += tl.sum(dy, axis=0)
        if not ONLY_DB:
            x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(rstd_ptr + rows, mask=rm, other=0.0)
            if CENTRED:
                x = x - tl.load(mean_ptr + rows, mask=rm, other=0.0)[:, None]
            g += tl.sum(dy * x * rstd[:, None], axis=0)
    out = tl.program_id(1) * n_cols + cols
    if not ONLY_DB:
        tl.store(dw_part_ptr + out, g, mask=cols < n_cols)
    if CENTRED:
        tl.store(db_part_ptr + out, b, mask=cols < n_cols)


def run_split(x, w, dy, mean, rstd, dx, centred, warps, stages, persist, rb, cb, splits, cwarps):
    m, n = x.shape
    grid = (2 * SMS,) if persist else (m,)
    mu = mean if centred else rstd
    dx_only[grid](x, w, dy, mu, rstd, dx, m, n, BLOCK=triton.next_power_of_2(n), CENTRED=centred,
                  STAGES=stages, PERSIST=persist, num_warps=warps)
    parts = torch.empty((2, splits, n), dtype=torch.float32, device=DEV)
    dgb_cols[(triton.cdiv(n, cb), splits)](x, dy, mu, rstd, parts[0], parts[1], m, n, triton.cdiv(m, splits), RB=rb,
                                          CB=cb, CENTRED=centred, ONLY_DB=False, STAGES=3, num_warps=cwarps)
    return dx, s._sum_parts(parts[0], x), s._sum_parts(parts[1], x) if centred else None


def run_chunked2(x, w, dy, mean, rstd, dx, centred, warps, no_db):
    m, n = x.shape
    rows = triton.cdiv(m, min(SMS, m))
    parts = torch.empty((2, triton.cdiv(m, rows), n), dtype=torch.float32, device=DEV)
    mu = mean if centred else rstd
    bwd_chunked2[(parts.shape[1],)](x, w, dy, mu, rstd, dx, parts[0], parts[1], m, n, rows,
                                    CW=triton.next_power_of_2(n) // 2, CENTRED=centred, NO_DB=no_db, num_warps=warps)
    if centred and no_db:
        db_parts = torch.empty((16, n), dtype=torch.float32, device=DEV)
        dgb_cols[(triton.cdiv(n, 128), 16)](x, dy, mu, rstd, db_parts, db_parts, m, n, triton.cdiv(m, 16), RB=16,
                                            CB=128, CENTRED=True, ONLY_DB=True, STAGES=3, num_warps=4)
        return dx, s._sum_parts(parts[0], x), s._sum_parts(db_parts, x)
    return dx, s._sum_parts(parts[0], x), s._sum_parts(parts[1], x) if centred else None


def part_bwd2(ceiling):
    for m, n in ((4096, 16384), (4096, 8192)):
        x, dy = (torch.randn(m, n, device=DEV, dtype=torch.bfloat16) for _ in range(2))
        w, b = 1 + 0.1 * torch.randn(n, device=DEV, dtype=torch.bfloat16), torch.zeros(n, device=DEV, dtype=torch.bfloat16)
        _, mean, rstd = s.layernorm(x, w, b)
        _, rrstd = s.rmsnorm(x, w)
        dx = torch.empty_like(x)
        nb = norm_cost(m, n, 2, "backward")["bytes"]
        xt, wt, bt = x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
        for centred in (True, False):
            st = rstd if centred else rrstd
            mu = mean if centred else None
            want = s.norm_backward(x, w, dy, mu, st)
            if centred:
                yt = torch.nn.functional.layer_norm(xt, (n,), wt, bt, 1e-5)
            else:
                yt = torch.nn.functional.rms_norm(xt, (n,), wt, 1e-5)
            line = [f"now {gbps(nb, lambda: s.norm_backward(x, w, dy, mu, st)) / ceiling:.3f}",
                    f"torch {gbps(nb, lambda: torch.autograd.grad(yt, (xt, wt, bt) if centred else (xt, wt), dy, retain_graph=True)) / ceiling:.3f}"]

            def check(tag, fn):
                try:
                    got = fn()
                    err = max((g.float() - e.float()).abs().max().item() for g, e in zip(got, want) if g is not None)
                    assert err < 0.05 * max(1.0, want[1].float().abs().max().item()), err
                    line.append(f"{tag} {gbps(nb, fn) / ceiling:.3f}")
                except Exception as exc:
                    line.append(f"{tag} FAIL {type(exc).__name__} {str(exc)[:40]}")
            for warps in (16, 32):
                for no_db in ((False, True) if centred else (False,)):
                    check(f"c2v w{warps}{' nodb' if no_db else ''}",
                          lambda: run_chunked2(x, w, dy, mean, st, dx, centred, warps, no_db))
            for warps, stages, persist in ((8, 1, False), (16, 1, False), (16, 2, True), (16, 3, True), (32, 1, False)):
                for rb, cb, splits, cwarps in ((16, 128, 8, 4), (32, 64, 16, 4), (8, 256, 8, 4), (16, 256, 4, 8)):
                    check(f"split w{warps} st{stages}{'p' if persist else ''} {rb}x{cb}/{splits} cw{cwarps}",
                          lambda: run_split(x, w, dy, mean, st, dx, centred, warps, stages, persist, rb, cb, splits, cwarps))
            print(m, n, "ln" if centred else "rms", " | ".join(line), flush=True)


def part_bwd(ceiling):
    for dtype in (torch.bfloat16,):
        for m, n in ((4096, 16384), (4096, 8192)):
            x, dy = (torch.randn(m, n, device=DEV, dtype=dtype) for _ in range(2))
            w, b = 1 + 0.1 * torch.randn(n, device=DEV, dtype=dtype), torch.zeros(n, device=DEV, dtype=dtype)
            _, mean, rstd = s.layernorm(x, w, b)
            _, rrstd = s.rmsnorm(x, w)
            dx = torch.empty_like(x)
            nb = norm_cost(m, n, x.element_size(), "backward")["bytes"]
            for centred in (True, False):
                st = rstd if centred else rrstd
                mu = mean if centred else None
                want = s.norm_backward(x, w, dy, mu, st)
                line = [f"now {gbps(nb, lambda: s.norm_backward(x, w, dy, mu, st)) / ceiling:.3f}"]
                for per_sm, warps in ((1, 16), (1, 32), (2, 8), (2, 16)):
                    if True:
                        for nchunk in (2, 4):
                            for stages in (1, 2):
                                for keep in (False, True):
                                    if n // nchunk < warps * 32:
                                        continue
                                    args = (x, w, dy, mean, st, dx, centred, per_sm, warps, nchunk, stages, keep)
                                    tag = f"{per_sm}/SM w{warps} c{nchunk} st{stages}{' keep' if keep else ''}"
                                    try:
                                        got, k = run_chunked(*args)
                                        err = max((g.float() - e.float()).abs().max().item()
                                                  for g, e in zip(got, want) if g is not None)
                                        scale = max(1.0, want[1].float().abs().max().item())
                                        assert err < 0.05 * scale, err
                                        line.append(f"{tag} {gbps(nb, lambda: run_chunked(*args)) / ceiling:.3f} (r{k.n_regs} s{k.n_spills})")
                                    except Exception as exc:
                                        line.append(f"{tag} FAIL {type(exc).__name__} {str(exc)[:40]}")
                print(dtype, m, n, "ln" if centred else "rms", " | ".join(line), flush=True)


def part_ab(ceiling):
    """The shipped launchers against their alternatives, bf16 and fp32: LayerNorm forward with and without the
    pipelined row loop, fused add + RMSNorm with w loaded before x, and the backward against torch."""
    for dtype in (torch.bfloat16, torch.float32):
        for m, n in SHAPES:
            x, r, dy = (torch.randn(m, n, device=DEV, dtype=dtype) for _ in range(3))
            w, b = 1 + 0.1 * torch.randn(n, device=DEV, dtype=dtype), 0.1 * torch.randn(n, device=DEV, dtype=dtype)
            y, h = torch.empty_like(x), torch.empty_like(x)
            mean, rstd = (torch.empty(m, device=DEV) for _ in range(2))
            nb, nbf, nbb = (norm_cost(m, n, x.element_size(), k)["bytes"] for k in ("forward", "fused", "backward"))
            block, warps = s._row_launch(n, x.element_size(), "layernorm")
            line = [f"ln {gbps(nb, lambda: s.layernorm(x, w, b, y)) / ceiling:.3f}",
                    f"ln-row {gbps(nb, lambda: s.layernorm_kernel[(m,)](x, w, b, y, mean, rstd, n, 1e-5, BLOCK=block, COMPUTE=tl.float32, num_warps=warps)) / ceiling:.3f}",
                    f"ln-loop {gbps(nb, lambda: s.layernorm_loop_kernel[(2 * SMS,)](x, w, b, y, mean, rstd, m, n, 1e-5, BLOCK=block, COMPUTE=tl.float32, STAGES=3, num_warps=16)) / ceiling:.3f}",
                    f"F.ln {gbps(nb, lambda: torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5)) / ceiling:.3f}"]
            want_fy, want_fh = s.fused_add_rmsnorm(x, r, w)
            line.append(f"fused {gbps(nbf, lambda: s.fused_add_rmsnorm(x, r, w, y)) / ceiling:.3f}")
            for fw in (4, 8, 16):
                fn = lambda: fused_fwd[(m,)](x, r, w, y, h, m, n, 1e-5, BLOCK=block, PERSIST=False, STAGES=1, EVICT=False, num_warps=fw)
                fn()
                assert torch.equal(h, want_fh) and (y.float() - want_fy.float()).abs().max().item() < 0.05
                line.append(f"fused-wfirst w{fw} {gbps(nbf, fn) / ceiling:.3f}")
            line.append(f"eager {gbps(nbf, lambda: torch.nn.functional.rms_norm(x + r, (n,), w, 1e-5)) / ceiling:.3f}")
            _, mu, st = s.layernorm(x, w, b)
            _, rst = s.rmsnorm(x, w)
            xt, wt, bt = x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
            yl = torch.nn.functional.layer_norm(xt, (n,), wt, bt, 1e-5)
            yr = torch.nn.functional.rms_norm(xt, (n,), wt, 1e-5)
            line += [f"ln-bwd {gbps(nbb, lambda: s.norm_backward(x, w, dy, mu, st)) / ceiling:.3f}",
                     f"torch {gbps(nbb, lambda: torch.autograd.grad(yl, (xt, wt, bt), dy, retain_graph=True)) / ceiling:.3f}",
                     f"rms-bwd {gbps(nbb, lambda: s.norm_backward(x, w, dy, None, rst)) / ceiling:.3f}",
                     f"torch {gbps(nbb, lambda: torch.autograd.grad(yr, (xt, wt), dy, retain_graph=True)) / ceiling:.3f}"]
            print(dtype, m, n, " | ".join(line), flush=True)


@triton.jit
def long_bwd_pf(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_part_ptr, db_part_ptr, n_rows, n_cols,
                rows_per_program, HALF: tl.constexpr, CENTRED: tl.constexpr):
    # long_row_backward_kernel with the next row's first half prefetched (raw, unconverted) during this row's dx
    pid = tl.program_id(0)
    lo = tl.arange(0, HALF)
    hi = HALF + lo
    dw_lo = tl.zeros([HALF], tl.float32)
    dw_hi = tl.zeros([HALF], tl.float32)
    db_lo = tl.zeros([HALF], tl.float32)
    db_hi = tl.zeros([HALF], tl.float32)
    first = pid * rows_per_program
    count = tl.minimum(rows_per_program, n_rows - first)
    base = first.to(tl.int64) * n_cols
    x_next = tl.load(x_ptr + base + lo, mask=lo < n_cols, other=0.0)
    dy_next = tl.load(dy_ptr + base + lo, mask=lo < n_cols, other=0.0)
    for i in range(0, count):
        row = first + i
        base = row.to(tl.int64) * n_cols
        rstd = tl.load(rstd_ptr + row)
        mean = tl.load(mean_ptr + row) if CENTRED else 0.0
        x = x_next.to(tl.float32)
        dy = dy_next.to(tl.float32)
        w = tl.load(w_ptr + lo, mask=lo < n_cols, other=0.0).to(tl.float32)
        xhat = tl.where(lo < n_cols, (x - mean) * rstd, 0.0)
        sum_xw = xhat * w * dy
        sum_w = w * dy
        dw_lo += dy * xhat
        db_lo += dy
        x = tl.load(x_ptr + base + hi, mask=hi < n_cols, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + base + hi, mask=hi < n_cols, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + hi, mask=hi < n_cols, other=0.0).to(tl.float32)
        xhat = tl.where(hi < n_cols, (x - mean) * rstd, 0.0)
        sum_xw += xhat * w * dy
        sum_w += w * dy
        dw_hi += dy * xhat
        db_hi += dy
        if CENTRED:
            s1, s2 = tl.reduce((sum_xw, sum_w), 0, s._sum_pairs)
            c2 = s2 / n_cols
        else:
            s1 = tl.sum(sum_xw, axis=0)
            c2 = 0.0
        c1 = s1 / n_cols
        more = lo < tl.where(i + 1 < count, n_cols, 0)
        x_next = tl.load(x_ptr + base + n_cols + lo, mask=more, other=0.0)
        dy_next = tl.load(dy_ptr + base + n_cols + lo, mask=more, other=0.0)
        tl.store(dx_ptr + base + hi, ((w * dy - (xhat * c1 + c2)) * rstd).to(dx_ptr.dtype.element_ty), mask=hi < n_cols)
        x = tl.load(x_ptr + base + lo, mask=lo < n_cols, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + base + lo, mask=lo < n_cols, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + lo, mask=lo < n_cols, other=0.0).to(tl.float32)
        tl.store(dx_ptr + base + lo, ((w * dy - ((x - mean) * rstd * c1 + c2)) * rstd).to(dx_ptr.dtype.element_ty),
                 mask=lo < n_cols)
    tl.store(dw_part_ptr + pid * n_cols + lo, dw_lo, mask=lo < n_cols)
    tl.store(dw_part_ptr + pid * n_cols + hi, dw_hi, mask=hi < n_cols)
    if CENTRED:
        tl.store(db_part_ptr + pid * n_cols + lo, db_lo, mask=lo < n_cols)
        tl.store(db_part_ptr + pid * n_cols + hi, db_hi, mask=hi < n_cols)


@triton.jit
def fused_wfirst(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, n_cols, eps, BLOCK: tl.constexpr):
    # the course's fused_add_rmsnorm_kernel with w loaded before x and the residual
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    offsets = row * n_cols + cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    r = tl.load(r_ptr + offsets, mask=mask, other=0.0)
    h = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + offsets, h, mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(h.to(tl.float32) * h.to(tl.float32), axis=0) / n_cols + eps)
    tl.store(y_ptr + offsets, (h.to(tl.float32) * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def part_ab2(ceiling):
    for dtype in (torch.bfloat16, torch.float32):
        for m, n in SHAPES:
            x, r, dy = (torch.randn(m, n, device=DEV, dtype=dtype) for _ in range(3))
            w, b = 1 + 0.1 * torch.randn(n, device=DEV, dtype=dtype), 0.1 * torch.randn(n, device=DEV, dtype=dtype)
            y, h = torch.empty_like(x), torch.empty_like(x)
            mean, rstd = (torch.empty(m, device=DEV) for _ in range(2))
            nb, nbf, nbb = (norm_cost(m, n, x.element_size(), k)["bytes"] for k in ("forward", "fused", "backward"))
            block, warps = s._row_launch(n, x.element_size(), "layernorm")
            want = s.layernorm(x, w, b)[0]
            line = []
            for rep in range(2):
                line.append(f"ln-row {gbps(nb, lambda: s.layernorm_kernel[(m,)](x, w, b, y, mean, rstd, n, 1e-5, BLOCK=block, COMPUTE=tl.float32, num_warps=warps)) / ceiling:.3f}")
                for lw, per_sm in ((16, 2), (8, 2), (16, 1)):
                    fn = lambda: ln_fwd[(per_sm * SMS,)](x, w, b, y, mean, rstd, m, n, 1e-5, BLOCK=block, RMS=False, PERSIST=True, STAGES=3, EVICT=False, num_warps=lw)
                    try:
                        fn()
                        assert (y.float() - want.float()).abs().max().item() < 0.05
                        line.append(f"ln-held p{per_sm} w{lw} {gbps(nb, fn) / ceiling:.3f}")
                    except Exception as exc:
                        line.append(f"ln-held p{per_sm} w{lw} FAIL {type(exc).__name__}")
            want_fy, want_fh = s.fused_add_rmsnorm(x, r, w)
            fwarps = s._row_launch(n, x.element_size(), "fused")[1]
            for rep in range(2):
                line.append(f"fused w{fwarps} {gbps(nbf, lambda: s.fused_add_rmsnorm(x, r, w, y)) / ceiling:.3f}")
                for fw in (4, 8, 16):
                    fn = lambda: fused_wfirst[(m,)](x, r, w, y, h, n, 1e-5, BLOCK=block, num_warps=fw)
                    fn()
                    assert torch.equal(h, want_fh) and (y.float() - want_fy.float()).abs().max().item() < 0.05
                    line.append(f"wfirst w{fw} {gbps(nbf, fn) / ceiling:.3f}")
                line.append(f"eager {gbps(nbf, lambda: torch.nn.functional.rms_norm(x + r, (n,), w, 1e-5)) / ceiling:.3f}")
            if n > s.LONG_ROW:
                _, mu, st = s.layernorm(x, w, b)
                _, rst = s.rmsnorm(x, w)
                xt, wt, bt = x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
                yl = torch.nn.functional.layer_norm(xt, (n,), wt, bt, 1e-5)
                for centred, mm, ss in ((True, mu, st), (False, rst, rst)):
                    want_b = s.norm_backward(x, w, dy, mm if centred else None, ss)
                    line.append(f"{'ln' if centred else 'rms'}-bwd {gbps(nbb, lambda: s.norm_backward(x, w, dy, mm if centred else None, ss)) / ceiling:.3f}")
                    for bw in (16, 32):
                        rows = triton.cdiv(m, SMS)
                        parts = torch.empty((2, triton.cdiv(m, rows), n), dtype=torch.float32, device=DEV)
                        dx = torch.empty_like(x)
                        def fn():
                            k = long_bwd_pf[(parts.shape[1],)](x, w, dy, mm, ss, dx, parts[0], parts[1], m, n, rows, HALF=block // 2, CENTRED=centred, num_warps=bw)
                            return k, (dx, s._sum_parts(parts[0], x), s._sum_parts(parts[1], x) if centred else None)
                        k, got = fn()
                        err = max((g.float() - e.float()).abs().max().item() for g, e in zip(got, want_b) if g is not None)
                        ok = err < 0.05 * max(1.0, want_b[1].float().abs().max().item())
                        line.append(f"pf w{bw} {gbps(nbb, fn) / ceiling:.3f} r{k.n_regs} s{k.n_spills}{'' if ok else ' WRONG'}")
                    for bw in (16, 32):
                        rows = triton.cdiv(m, SMS)
                        parts = torch.empty((2, triton.cdiv(m, rows), n), dtype=torch.float32, device=DEV)
                        fn = lambda: s.long_row_backward_kernel[(parts.shape[1],)](x, w, dy, mm, ss, dx, parts[0], parts[1], m, n, rows, HALF=block // 2, CENTRED=centred, COMPUTE=tl.float32, num_warps=bw)
                        k = fn()
                        line.append(f"halves w{bw} {gbps(nbb, fn) / ceiling:.3f} r{k.n_regs} s{k.n_spills}")
                line.append(f"torch-ln-bwd {gbps(nbb, lambda: torch.autograd.grad(yl, (xt, wt, bt), dy, retain_graph=True)) / ceiling:.3f}")
            print(dtype, m, n, " | ".join(line), flush=True)


@triton.jit
def long_bwd_v(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, part_ptr, n_rows, n_cols, rows_per_program,
               part_stride, HALF: tl.constexpr, CENTRED: tl.constexpr, PER_HALF: tl.constexpr, KEEP_HI: tl.constexpr):
    # two-halves backward variants: PER_HALF reduces each half's row sums at once (no sum vectors held);
    # KEEP_HI False re-reads both halves for dx. dγ partial at part_ptr + pid·stride, dβ at + n_cols.
    pid = tl.program_id(0)
    lo = tl.arange(0, HALF)
    hi = HALF + lo
    dw_lo = tl.zeros([HALF], tl.float32)
    dw_hi = tl.zeros([HALF], tl.float32)
    db_lo = tl.zeros([HALF], tl.float32)
    db_hi = tl.zeros([HALF], tl.float32)
    first = pid * rows_per_program
    for i in range(0, tl.minimum(rows_per_program, n_rows - first)):
        row = first + i
        base = row.to(tl.int64) * n_cols
        rstd = tl.load(rstd_ptr + row)
        mean = tl.load(mean_ptr + row) if CENTRED else 0.0
        x = tl.load(x_ptr + base + lo, mask=lo < n_cols, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + base + lo, mask=lo < n_cols, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + lo, mask=lo < n_cols, other=0.0).to(tl.float32)
        xhat = tl.where(lo < n_cols, (x - mean) * rstd, 0.0)
        dw_lo += dy * xhat
        db_lo += dy
        if PER_HALF:
            s1, s2 = tl.reduce((xhat * w * dy, w * dy), 0, s._sum_pairs)
        else:
            v1 = xhat * w * dy
            v2 = w * dy
        x = tl.load(x_ptr + base + hi, mask=hi < n_cols, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + base + hi, mask=hi < n_cols, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + hi, mask=hi < n_cols, other=0.0).to(tl.float32)
        xhat = tl.where(hi < n_cols, (x - mean) * rstd, 0.0)
        dw_hi += dy * xhat
        db_hi += dy
        if PER_HALF:
            t1, t2 = tl.reduce((xhat * w * dy, w * dy), 0, s._sum_pairs)
            s1 += t1
            s2 += t2
        else:
            s1, s2 = tl.reduce((v1 + xhat * w * dy, v2 + w * dy), 0, s._sum_pairs)
        c1 = s1 / n_cols
        c2 = s2 / n_cols if CENTRED else 0.0
        if KEEP_HI:
            tl.store(dx_ptr + base + hi, ((w * dy - (xhat * c1 + c2)) * rstd).to(dx_ptr.dtype.element_ty), mask=hi < n_cols)
        else:
            _pass2(x_ptr, dy_ptr, w_ptr, dx_ptr, base, hi, n_cols, mean, rstd, c1, c2, False)
        _pass2(x_ptr, dy_ptr, w_ptr, dx_ptr, base, lo, n_cols, mean, rstd, c1, c2, False)
    out = part_ptr + pid * part_stride
    tl.store(out + lo, dw_lo, mask=lo < n_cols)
    tl.store(out + hi, dw_hi, mask=hi < n_cols)
    if CENTRED:
        tl.store(out + n_cols + lo, db_lo, mask=lo < n_cols)
        tl.store(out + n_cols + hi, db_hi, mask=hi < n_cols)


@triton.jit
def fused_rows(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, n_rows, n_cols, eps, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    r = tl.load(r_ptr + offs, mask=mask, other=0.0)
    h = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + offs, h, mask=mask)
    hf = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=1) / n_cols + eps)
    tl.store(y_ptr + offs, (hf * rstd[:, None] * w[None, :]).to(y_ptr.dtype.element_ty), mask=mask)


def part_ab3(ceiling):
    m, n = 4096, 16384
    x, dy = (torch.randn(m, n, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    w, b = 1 + 0.1 * torch.randn(n, device=DEV, dtype=torch.bfloat16), 0.1 * torch.randn(n, device=DEV, dtype=torch.bfloat16)
    _, mu, st = s.layernorm(x, w, b)
    nbb = norm_cost(m, n, 2, "backward")["bytes"]
    xt, wt, bt = x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
    yl = torch.nn.functional.layer_norm(xt, (n,), wt, bt, 1e-5)
    want = s.norm_backward(x, w, dy, mu, st)
    dx = torch.empty_like(x)
    line = [f"torch {gbps(nbb, lambda: torch.autograd.grad(yl, (xt, wt, bt), dy, retain_graph=True)) / ceiling:.3f}",
            f"now {gbps(nbb, lambda: s.norm_backward(x, w, dy, mu, st)) / ceiling:.3f}"]
    for per_half in (False, True):
        for keep in (True, False):
            for warps in (16, 32):
                def fn():
                    parts = torch.empty((SMS, 2 * n), dtype=torch.float32, device=DEV)
                    k = long_bwd_v[(SMS,)](x, w, dy, mu, st, dx, parts, m, n, triton.cdiv(m, SMS), 2 * n, HALF=n // 2,
                                           CENTRED=True, PER_HALF=per_half, KEEP_HI=keep, num_warps=warps)
                    both = s._sum_parts(parts, x)
                    return k, (dx, both[:n], both[n:])
                k, got = fn()
                err = max((g.float() - e.float()).abs().max().item() for g, e in zip(got, want))
                ok = err < 0.05 * max(1.0, want[1].float().abs().max().item())
                line.append(f"{'perhalf' if per_half else 'vec'}{' keep' if keep else ''} w{warps} {gbps(nbb, fn) / ceiling:.3f} r{k.n_regs} s{k.n_spills}{'' if ok else ' WRONG'}")
    print("ln-bwd merged stage 2", m, n, " | ".join(line), flush=True)
    for m, n in ((32768, 4096), (4096, 4096)):
        x, r = (torch.randn(m, n, device=DEV, dtype=torch.bfloat16) for _ in range(2))
        y, h = torch.empty_like(x), torch.empty_like(x)
        want_fy, want_fh = s.fused_add_rmsnorm(x, r, w[:n])
        nbf = norm_cost(m, n, 2, "fused")["bytes"]
        line = [f"eager {gbps(nbf, lambda: torch.nn.functional.rms_norm(x + r, (n,), w[:n], 1e-5)) / ceiling:.3f}"]
        for rows in (1, 2, 4):
            for warps in (4, 8, 16):
                fn = lambda: fused_rows[(triton.cdiv(m, rows),)](x, r, w, y, h, m, n, 1e-5, BLOCK=n, ROWS=rows, num_warps=warps)
                fn()
                assert torch.equal(h, want_fh) and (y.float() - want_fy.float()).abs().max().item() < 0.05
                line.append(f"rows{rows} w{warps} {gbps(nbf, fn) / ceiling:.3f}")
        line.append(f"eager {gbps(nbf, lambda: torch.nn.functional.rms_norm(x + r, (n,), w[:n], 1e-5)) / ceiling:.3f}")
        print("fused", m, n, " | ".join(line), flush=True)


if __name__ == "__main__":
    ceiling = bench.copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.1f} GB/s", flush=True)
    parts = sys.argv[1:] or ["copy", "fwd", "bwd"]
    for part in parts:
        {"copy": part_copy, "fwd": part_fwd, "bwd": part_bwd, "bwd2": part_bwd2, "ab": part_ab, "ab2": part_ab2, "ab3": part_ab3}[part](ceiling)
