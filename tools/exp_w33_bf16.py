"""Week-33 bf16 speed experiments (session 3): register caps, software-pipelined loops, TMA loads.
Run on a GPU from the repository root: python3 tools/exp_w33_bf16.py [--quick]. Writes $OUT/exp.csv.
Each variant is checked against torch.softmax in float32 before it is timed."""
import os
import sys
import traceback

import torch
import triton
import triton.language as tl

from course import bench
from solutions import w33_softmax as s

OUT = os.environ.get("OUT", "/tmp/out")
QUICK = "--quick" in sys.argv
SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


@triton.jit
def row_lse_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    # One program per row; x stays in its own dtype, y = exp(x - lse) recomputed at the store.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    m = tl.max(x.to(tl.float32), axis=0)
    lse = m + tl.log(tl.sum(tl.exp(x.to(tl.float32) - m), axis=0))
    tl.store(y_ptr + row * n_cols + cols, tl.exp(x.to(tl.float32) - lse).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def looped_kernel(x_ptr, y_ptr, n_rows, n_cols, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    # Rows pid, pid + P, ...; pass 1 online (m, l), pass 2 back to front; loops software-pipelined.
    cols = tl.arange(0, BLOCK)
    n_blocks = tl.cdiv(n_cols, BLOCK)
    for row in range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):
        x_row = x_ptr + row * n_cols
        y_row = y_ptr + row * n_cols
        m = tl.full([BLOCK], -3.0e38, tl.float32)
        l = tl.zeros([BLOCK], tl.float32)
        for b in tl.range(0, n_blocks, num_stages=STAGES):
            x = tl.load(x_row + b * BLOCK + cols, mask=b * BLOCK + cols < n_cols, other=-float("inf")).to(tl.float32)
            e = tl.exp(-tl.abs(x - m))
            l = tl.where(x > m, l * e + 1.0, l + e)
            m = tl.maximum(m, x)
        m_row = tl.max(m, axis=0)
        inv = 1.0 / tl.sum(l * tl.exp(m - m_row), axis=0)
        for i in tl.range(0, n_blocks, num_stages=STAGES):
            start = (n_blocks - 1 - i) * BLOCK
            mask = start + cols < n_cols
            x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
            tl.store(y_row + start + cols, (tl.exp(x - m_row) * inv).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def looped_tma_kernel(x_desc, y_desc, n_rows, n_chunks, R: tl.constexpr, W: tl.constexpr, STAGES: tl.constexpr):
    # x viewed as (rows, n_cols / W, W); one TMA load brings R chunks of W columns.
    chunk = tl.arange(0, R)[None, :, None]
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        m = tl.full([1, R, W], -3.0e38, tl.float32)
        l = tl.zeros([1, R, W], tl.float32)
        for c in tl.range(0, n_chunks, R, num_stages=STAGES):
            x = x_desc.load([row, c, 0]).to(tl.float32)
            x = tl.where(c + chunk < n_chunks, x, -float("inf"))
            e = tl.exp(-tl.abs(x - m))
            l = tl.where(x > m, l * e + 1.0, l + e)
            m = tl.maximum(m, x)
        m_row = tl.max(tl.max(tl.max(m, axis=2), axis=1), axis=0)
        inv = 1.0 / tl.sum(tl.sum(tl.sum(l * tl.exp(m - m_row), axis=2), axis=1), axis=0)
        n_blocks = tl.cdiv(n_chunks, R)
        for i in tl.range(0, n_blocks, num_stages=STAGES):
            c = (n_blocks - 1 - i) * R
            x = x_desc.load([row, c, 0]).to(tl.float32)
            y_desc.store([row, c, 0], (tl.exp(x - m_row) * inv).to(y_desc.dtype))


@triton.jit
def looped_lean_kernel(x_ptr, y_ptr, n_rows, n_cols, BLOCK: tl.constexpr, PER: tl.constexpr, STAGES: tl.constexpr):
    # Like looped_kernel, with one running (m, l) per PER neighbouring columns (one thread's vector) and
    # exp2 with log2(e) folded into one FMA: about 5 instructions per element instead of 10.
    G: tl.constexpr = BLOCK // PER
    offs = tl.arange(0, G)[:, None] * PER + tl.arange(0, PER)[None, :]
    LOG2E: tl.constexpr = 1.4426950408889634
    n_blocks = tl.cdiv(n_cols, BLOCK)
    for row in range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):
        x_row = x_ptr + row * n_cols
        y_row = y_ptr + row * n_cols
        m = tl.full([G], -1.0e38, tl.float32)
        l = tl.zeros([G], tl.float32)
        for b in tl.range(0, n_blocks, num_stages=STAGES):
            x = tl.load(x_row + b * BLOCK + offs, mask=b * BLOCK + offs < n_cols, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=1))
            l = l * tl.exp2((m - m_new) * LOG2E) + tl.sum(tl.exp2(x * LOG2E - (m_new * LOG2E)[:, None]), axis=1)
            m = m_new
        m_row = tl.max(m, axis=0)
        shift = m_row * LOG2E + tl.log2(tl.sum(l * tl.exp2((m - m_row) * LOG2E), axis=0))
        for i in tl.range(0, n_blocks, num_stages=STAGES):
            start = (n_blocks - 1 - i) * BLOCK
            mask = start + offs < n_cols
            x = tl.load(x_row + start + offs, mask=mask, other=-float("inf")).to(tl.float32)
            tl.store(y_row + start + offs, tl.exp2(x * LOG2E - shift).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _block(row_ptr, start, offs, n_cols, EVEN: tl.constexpr):
    if EVEN:
        return tl.load(row_ptr + start + offs)
    else:
        return tl.load(row_ptr + start + offs, mask=start + offs < n_cols, other=-float("inf"))


@triton.jit
def _segment_state(x_row, lo, n_blocks, n_cols, offs, G: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    # Pass 1 over blocks lo, lo + BLOCK, ...: a running (m, l) per thread vector, the next block
    # loaded into registers before this one is reduced. Returns the segment's (m, l) in log2 units.
    LOG2E: tl.constexpr = 1.4426950408889634
    m = tl.full([G], -1.0e38, tl.float32)
    l = tl.zeros([G], tl.float32)
    nxt = _block(x_row, lo, offs, n_cols, EVEN)
    for b in range(0, n_blocks):
        x = nxt.to(tl.float32)
        nxt = _block(x_row, lo + tl.minimum(b + 1, n_blocks - 1) * BLOCK, offs, n_cols, EVEN)
        m_new = tl.maximum(m, tl.max(x, axis=1))
        l = l * tl.exp2((m - m_new) * LOG2E) + tl.sum(tl.exp2(x * LOG2E - (m_new * LOG2E)[:, None]), axis=1)
        m = m_new
    m_seg = tl.max(m, axis=0)
    return m_seg, tl.sum(l * tl.exp2((m - m_seg) * LOG2E), axis=0)


@triton.jit
def _segment_write(x_row, y_row, lo, n_blocks, n_cols, offs, shift, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    # Pass 2, back to front (the blocks read last are the likeliest to be in L2): y = exp2(x log2e - shift).
    LOG2E: tl.constexpr = 1.4426950408889634
    nxt = _block(x_row, lo + (n_blocks - 1) * BLOCK, offs, n_cols, EVEN)
    for i in range(0, n_blocks):
        start = lo + (n_blocks - 1 - i) * BLOCK
        x = nxt.to(tl.float32)
        nxt = _block(x_row, lo + tl.maximum(n_blocks - 2 - i, 0) * BLOCK, offs, n_cols, EVEN)
        y = tl.exp2(x * LOG2E - shift).to(y_row.dtype.element_ty)
        if EVEN:
            tl.store(y_row + start + offs, y)
        else:
            tl.store(y_row + start + offs, y, mask=start + offs < n_cols)


@triton.jit
def lean2_kernel(x_ptr, y_ptr, n_rows, n_cols, BLOCK: tl.constexpr, PER: tl.constexpr, EVEN: tl.constexpr):
    G: tl.constexpr = BLOCK // PER
    offs = tl.arange(0, G)[:, None] * PER + tl.arange(0, PER)[None, :]
    n_blocks = tl.cdiv(n_cols, BLOCK)
    for row in range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):
        m, l = _segment_state(x_ptr + row * n_cols, 0, n_blocks, n_cols, offs, G, BLOCK, EVEN)
        shift = m * 1.4426950408889634 + tl.log2(l)
        _segment_write(x_ptr + row * n_cols, y_ptr + row * n_cols, 0, n_blocks, n_cols, offs, shift, BLOCK, EVEN)


@triton.jit
def seg_kernel(x_ptr, y_ptr, sync_ptr, state_ptr, clean_ptr, n_cols, n_segs, n_clean,
               SEG: tl.constexpr, BLOCK: tl.constexpr, PER: tl.constexpr, MAX_SEGS: tl.constexpr, EVEN: tl.constexpr):
    # GPU only. Rows split into segments of SEG columns, one program each (tickets as in split_softmax_kernel).
    G: tl.constexpr = BLOCK // PER
    offs = tl.arange(0, G)[:, None] * PER + tl.arange(0, PER)[None, :]
    ticket = tl.atomic_add(sync_ptr, 1)
    for j in range(tl.program_id(0), n_clean, tl.num_programs(0)):
        tl.store(clean_ptr + j, 0)
    row = ticket // n_segs
    lo = (ticket % n_segs) * SEG
    n_blocks = tl.cdiv(tl.minimum(SEG, n_cols - lo), BLOCK)
    x_row = x_ptr + row.to(tl.int64) * n_cols
    m, l = _segment_state(x_row, lo, n_blocks, n_cols, offs, G, BLOCK, EVEN)
    tl.store(state_ptr + 2 * ticket, m)
    tl.store(state_ptr + 2 * ticket + 1, l)
    arrived = tl.atomic_add(sync_ptr + 1 + row, 1, sem="release") + 1
    while arrived < n_segs:
        arrived = tl.atomic_add(sync_ptr + 1 + row, 0, sem="acquire")
    sibling = row * n_segs + tl.arange(0, MAX_SEGS)
    live = tl.arange(0, MAX_SEGS) < n_segs
    ms = tl.load(state_ptr + 2 * sibling, mask=live, other=-1.0e38, cache_modifier=".cg")
    ls = tl.load(state_ptr + 2 * sibling + 1, mask=live, other=0.0, cache_modifier=".cg")
    m_row = tl.max(ms, axis=0)
    shift = m_row * 1.4426950408889634 + tl.log2(tl.sum(ls * tl.exp2((ms - m_row) * 1.4426950408889634), axis=0))
    _segment_write(x_row, y_ptr + row.to(tl.int64) * n_cols, lo, n_blocks, n_cols, offs, shift, BLOCK, EVEN)


def run_lean2(x, out, block, per, warps, per_sm, maxnreg=None):
    m, n = x.shape
    grid = m if per_sm is None else min(m, max(1, int(per_sm * SMS)))
    lean2_kernel[(grid,)](x, out, m, n, BLOCK=block, PER=per, EVEN=n % block == 0, num_warps=warps, maxnreg=maxnreg)


def run_seg(x, out, seg, block, per, warps, maxnreg=None):
    m, n = x.shape
    segs = triton.cdiv(n, seg)
    sync, clean = s._split_counters(1 + m, x.device)
    states = torch.empty(2 * m * segs, dtype=torch.float32, device=x.device)
    seg_kernel[(m * segs,)](x, out, sync, states, clean, n, segs, clean.numel(), SEG=seg, BLOCK=block, PER=per,
                            MAX_SEGS=max(2, triton.next_power_of_2(segs)), EVEN=n % seg == 0,
                            num_warps=warps, maxnreg=maxnreg)


def run_lean(x, out, block, per, warps, stages, per_sm, maxnreg=None):
    m, n = x.shape
    grid = m if per_sm is None else min(m, max(1, int(per_sm * SMS)))
    looped_lean_kernel[(grid,)](x, out, m, n, BLOCK=block, PER=per, STAGES=stages, num_warps=warps, maxnreg=maxnreg)


def run_row_lse(x, out, warps, maxnreg):
    n = x.shape[1]
    row_lse_kernel[(x.shape[0],)](x, out, n, BLOCK=triton.next_power_of_2(n), num_warps=warps, maxnreg=maxnreg)


def run_row(x, out, warps, maxnreg):
    n = x.shape[1]
    s.softmax_kernel[(x.shape[0],)](x, out, n, BLOCK=triton.next_power_of_2(n), num_warps=warps, maxnreg=maxnreg)


def run_looped(x, out, block, warps, stages, per_sm):
    m, n = x.shape
    grid = m if per_sm is None else min(m, max(1, int(per_sm * SMS)))
    looped_kernel[(grid,)](x, out, m, n, BLOCK=block, STAGES=stages, num_warps=warps)


_DESC = {}


def run_tma(x, out, r, warps, stages, per_sm, w=256):
    from triton.tools.tensor_descriptor import TensorDescriptor
    m, n = x.shape
    key = (x.data_ptr(), out.data_ptr(), r, w)
    if key not in _DESC:
        _DESC[key] = (TensorDescriptor.from_tensor(x.view(m, n // w, w), [1, r, w]),
                      TensorDescriptor.from_tensor(out.view(m, n // w, w), [1, r, w]))
    xd, yd = _DESC[key]
    grid = m if per_sm is None else min(m, max(1, int(per_sm * SMS)))
    looped_tma_kernel[(grid,)](xd, yd, m, n // w, R=r, W=w, STAGES=stages, num_warps=warps)


def run_split(x, out, block, warps, maxnreg):
    m, n = x.shape
    splits = triton.cdiv(n, block)
    sync, clean = s._split_counters(1 + m, x.device)
    states = torch.empty(2 * m * splits, dtype=torch.float32, device=x.device)
    s.split_softmax_kernel[(m * splits,)](x, out, sync, states, clean, n, splits, clean.numel(), BLOCK=block,
                                          MAX_SPLITS=max(2, triton.next_power_of_2(splits)), num_warps=warps,
                                          maxnreg=maxnreg)


def variants3(m, n, dtype):
    v = [("current_online", {}, lambda x, o: s.online_softmax(x, o))]
    if n <= 65536:
        for warps, reg in ((16, 40), (16, None), (8, None), (4, None), (8, 72)):
            v.append(("row_lse", dict(warps=warps, maxnreg=reg), lambda x, o, w=warps, r=reg: run_row_lse(x, o, w, r)))
    if n >= 16384:
        v.append(("lean", dict(block=8192, per=8, warps=16, stages=3),
                  lambda x, o: run_lean(x, o, 8192, 8, 16, 3, None)))
        for block, warps in ((2048, 4), (4096, 4), (4096, 8), (8192, 8), (8192, 16)):
            for per_sm in (None, 2, 3, 4):
                v.append(("lean2", dict(block=block, warps=warps, per_sm=per_sm),
                          lambda x, o, b=block, w=warps, p=per_sm: run_lean2(x, o, b, 8, w, p)))
            for seg in (16384, 32768, 65536):
                if seg >= block and seg < n:
                    v.append(("seg", dict(block=block, warps=warps, seg=seg),
                              lambda x, o, sg=seg, b=block, w=warps: run_seg(x, o, sg, b, 8, w)))
    return v


def variants2(m, n, dtype):
    v = [("current_online", {}, lambda x, o: s.online_softmax(x, o))]
    if n <= 65536:
        v.append(("current_row", {}, lambda x, o: s.triton_softmax(x, o)))
        for warps, regs in ((16, (None, 36, 40, 44)), (32, (None, 32)), (8, (None, 64, 72, 80))):
            for reg in regs:
                for rep in (0, 1):
                    v.append(("row_lse", dict(warps=warps, maxnreg=reg, rep=rep),
                              lambda x, o, w=warps, r=reg: run_row_lse(x, o, w, r)))
                v.append(("row", dict(warps=warps, maxnreg=reg), lambda x, o, w=warps, r=reg: run_row(x, o, w, r)))
    if n >= 65536:
        for block, per, warps in ((2048, 8, 4), (4096, 8, 4), (4096, 8, 8), (8192, 8, 8), (8192, 8, 16), (4096, 16, 4)):
            for stages in (1, 3, 4):
                for per_sm in (None, 2, 3):
                    v.append(("lean", dict(block=block, per=per, warps=warps, stages=stages, per_sm=per_sm),
                              lambda x, o, b=block, pe=per, w=warps, st=stages, p=per_sm: run_lean(x, o, b, pe, w, st, p)))
    return v


def variants(m, n, dtype):
    v = [("current_online", {}, lambda x, o: s.online_softmax(x, o))]
    if n <= 65536:
        v.append(("current_row", {}, lambda x, o: s.triton_softmax(x, o)))
        for warps in (8, 16, 32):
            for reg in (None, 32, 40, 48, 64):
                v.append(("row", dict(warps=warps, maxnreg=reg), lambda x, o, w=warps, r=reg: run_row(x, o, w, r)))
                v.append(("row_lse", dict(warps=warps, maxnreg=reg),
                          lambda x, o, w=warps, r=reg: run_row_lse(x, o, w, r)))
    if n >= 65536:
        for block, warps in ((2048, 4), (4096, 4), (4096, 8), (8192, 8), (8192, 16)):
            for stages in (2, 3, 4):
                for per_sm in (None, 1, 2, 4):
                    v.append(("looped", dict(block=block, warps=warps, stages=stages, per_sm=per_sm),
                              lambda x, o, b=block, w=warps, st=stages, p=per_sm: run_looped(x, o, b, w, st, p)))
        for r, warps in ((8, 4), (16, 4), (16, 8), (32, 8), (32, 16)):
            for stages in (2, 3, 4):
                for per_sm in (None, 0.5, 1, 2):
                    v.append(("tma", dict(block=256 * r, warps=warps, stages=stages, per_sm=per_sm),
                              lambda x, o, r=r, w=warps, st=stages, p=per_sm: run_tma(x, o, r, w, st, p)))
        for block, warps in ((2048, 4), (4096, 4), (4096, 8), (8192, 8)):
            for reg in (None, 32, 48):
                v.append(("split", dict(block=block, warps=warps, maxnreg=reg),
                          lambda x, o, b=block, w=warps, r=reg: run_split(x, o, b, w, r)))
    return v


def main():
    import pandas as pd
    os.makedirs(OUT, exist_ok=True)
    ceiling = bench.copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.1f} GB/s on {torch.cuda.get_device_name()}", flush=True)
    phase2 = "--phase2" in sys.argv
    phase3 = "--phase3" in sys.argv
    sizes = [(4096, 16384), (1024, 65536), (256, 262144)]
    work = [(torch.bfloat16, m, n) for m, n in sizes]
    if phase3:
        work = [(torch.bfloat16, m, n) for m, n in sizes] + [(torch.float32, 1024, 65536), (torch.float32, 256, 262144),
                                                             (torch.bfloat16, 4096, 4096), (torch.float32, 4096, 4096)]
    if phase2:
        work += [(torch.float16, 4096, 16384), (torch.bfloat16, 4096, 8192), (torch.bfloat16, 4096, 4096),
                 (torch.float32, 4096, 16384), (torch.float32, 4096, 4096), (torch.float32, 1024, 65536)]
    rows = []
    if True:
        for dtype, m, n in work:
            x = torch.randn(m, n, device="cuda", dtype=dtype) * 4
            out = torch.empty_like(x)
            ref = torch.softmax(x.float(), -1)
            nbytes = 2 * m * n * x.element_size()
            t_torch = bench.gpu_ms(lambda: torch.softmax(x, -1), rep_ms=100)
            for name, cfg, fn in (variants3 if phase3 else variants2 if phase2 else variants)(m, n, dtype):
                row = {"variant": name, **cfg, "dtype": str(dtype)[6:], "M": m, "N": n}
                try:
                    out.fill_(float("nan"))
                    fn(x, out)
                    torch.cuda.synchronize()
                    err = (out.float() - ref).abs().max().item()
                    if not err < 1e-2:
                        raise AssertionError(f"max error {err}")
                    ms = bench.gpu_ms(lambda: fn(x, out), rep_ms=60)
                    row.update(ms=ms, vs_copy=nbytes / ms / 1e6 / ceiling, vs_torch=t_torch / ms, error=err)
                except Exception as exc:  # record and go on: one broken variant must not stop the sweep
                    row.update(failed=f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}")
                    if "--trace" in sys.argv:
                        traceback.print_exc()
                rows.append(row)
                print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
            table = pd.DataFrame(rows)
            table.to_csv(f"{OUT}/exp.csv", index=False)
    table = pd.DataFrame(rows)
    ok = table[table.get("failed").isna()] if "failed" in table else table
    print("\nbest per variant and size:")
    best = ok.sort_values("vs_copy", ascending=False).groupby(["variant", "M", "N"]).head(2)
    print(best.sort_values(["M", "variant", "vs_copy"]).to_string(index=False))


if __name__ == "__main__":
    main()
