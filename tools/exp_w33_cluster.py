"""Week-33 experiment (session 4): a row held on chip across a thread-block cluster (num_ctas > 1).
Run on a GPU from the repository root: python3 tools/exp_w33_cluster.py. Writes $OUT/exp_cluster.csv.
Each variant is checked against torch.softmax in float32 (odd sizes too) before it is timed."""
import os
import sys

import torch
import triton
import triton.language as tl

from course import bench
from solutions import w33_softmax as s

OUT = os.environ.get("OUT", "/tmp/out")


@triton.jit
def _merge(m_a, l_a, m_b, l_b):
    m = tl.maximum(m_a, m_b)
    return m, l_a * tl.exp(m_a - m) + l_b * tl.exp(m_b - m)


@triton.jit
def cluster_kernel(x_ptr, y_ptr, n_cols, PIECES: tl.constexpr, PIECE: tl.constexpr):
    # One row per cluster; piece p of the row lives in CTA p's registers; the (m, l) states merge once.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, PIECES)[:, None] * PIECE + tl.arange(0, PIECE)[None, :]
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    m = tl.maximum(tl.max(x.to(tl.float32), axis=1), -1.0e38)
    l = tl.sum(tl.exp(x.to(tl.float32) - m[:, None]), axis=1)
    m_row, l_row = tl.reduce((m, l), 0, _merge)
    log_sum = tl.log(l_row)
    lse = m_row + log_sum
    lse_error = log_sum - (lse - m_row)
    tl.store(y_ptr + row * n_cols + cols, tl.exp(x.to(tl.float32) - lse - lse_error).to(y_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def cluster1d_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    # The row kernel's body (max, then sum) with the row spread over the cluster: two exchanges.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    m = tl.max(x.to(tl.float32), axis=0)
    log_sum = tl.log(tl.sum(tl.exp(x.to(tl.float32) - m), axis=0))
    lse = m + log_sum
    lse_error = log_sum - (lse - m)
    tl.store(y_ptr + row * n_cols + cols, tl.exp(x.to(tl.float32) - lse - lse_error).to(y_ptr.dtype.element_ty),
             mask=mask)


def run_cluster(x, out, pieces, warps, maxnreg):
    m, n = x.shape
    piece = triton.next_power_of_2(triton.cdiv(n, pieces))
    cluster_kernel[(m,)](x, out, n, PIECES=pieces, PIECE=piece, num_warps=warps, num_ctas=pieces, maxnreg=maxnreg)


def run_cluster1d(x, out, ctas, warps, maxnreg):
    m, n = x.shape
    cluster1d_kernel[(m,)](x, out, n, BLOCK=triton.next_power_of_2(n), num_warps=warps, num_ctas=ctas,
                           maxnreg=maxnreg)


def variants(m, n):
    v = [("current_online", {}, lambda x, o: s.online_softmax(x, o))]
    if n <= 16384:
        v.append(("current_row", {}, lambda x, o: s.triton_softmax(x, o)))
    for pieces in (2, 4, 8, 16):
        per = triton.next_power_of_2(triton.cdiv(n, pieces))
        if per < 2048 or per > 65536:
            continue
        for warps in (8, 16, 32):
            if per // (warps * 32) < 8 or per // (warps * 32) > 128:
                continue
            for reg in (None, 40, 48):
                v.append(("cluster", dict(ctas=pieces, warps=warps, maxnreg=reg),
                          lambda x, o, p=pieces, w=warps, r=reg: run_cluster(x, o, p, w, r)))
            if pieces in (4, 8, 16):
                v.append(("cluster1d", dict(ctas=pieces, warps=warps),
                          lambda x, o, p=pieces, w=warps: run_cluster1d(x, o, p, w, None)))
    return v


def main():
    import pandas as pd
    os.makedirs(OUT, exist_ok=True)
    print("triton", triton.__version__, "torch", torch.__version__, flush=True)
    # correctness first, at odd sizes, in every dtype: a kernel that fails here is not timed
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for m, n, pieces, warps in ((3, 65531, 4, 16), (5, 262139, 16, 16), (2, 100, 2, 1), (7, 40000, 8, 8)):
            x = (torch.randn(m, n, device="cuda") * 4).to(dtype)
            x[0, : n // 3] = -float("inf")
            if m > 2:
                x[2] += 1e4
            o = torch.full_like(x, float("nan"))
            try:
                run_cluster(x, o, pieces, max(1, warps), None)
                torch.cuda.synchronize()
                err = (o.float() - torch.softmax(x.float(), -1)).abs().max().item()
                print(f"check cluster {dtype} {m}x{n} ctas={pieces}: max err {err:.2e}", flush=True)
            except Exception as exc:
                print(f"check cluster {dtype} {m}x{n} FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    ceiling = bench.copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.1f} GB/s on {torch.cuda.get_device_name()}", flush=True)
    work = [(torch.bfloat16, 1024, 65536), (torch.bfloat16, 256, 262144), (torch.float32, 1024, 65536),
            (torch.float32, 256, 262144), (torch.bfloat16, 4096, 16384), (torch.float32, 4096, 16384)]
    rows = []
    for dtype, m, n in work:
        x = torch.randn(m, n, device="cuda", dtype=dtype) * 4
        out = torch.empty_like(x)
        ref = torch.softmax(x.float(), -1)
        nbytes = 2 * m * n * x.element_size()
        t_torch = bench.gpu_ms(lambda: torch.softmax(x, -1), rep_ms=100)
        for name, cfg, fn in variants(m, n):
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
            rows.append(row)
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        pd.DataFrame(rows).to_csv(f"{OUT}/exp_cluster.csv", index=False)
    table = pd.DataFrame(rows)
    ok = table[table["failed"].isna()] if "failed" in table else table
    print("\nbest per variant and size:")
    best = ok.sort_values("vs_copy", ascending=False).groupby(["variant", "dtype", "M", "N"]).head(2)
    print(best.sort_values(["dtype", "M", "variant", "vs_copy"]).to_string(index=False))


if __name__ == "__main__":
    main()
