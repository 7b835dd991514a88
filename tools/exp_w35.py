"""Week-35 tile sweeps, run on a GPU from the repository root: python3 tools/exp_w35.py [qk] [pv] [softmax]
Every configuration is checked against torch before it is timed; bf16, B = 4, H = 16."""
import math
import sys

import torch
import triton
import triton.language as tl

from course import bench
from course.w35_attention_blocks import reference as ref
from solutions import w35_attention_blocks as s

B, H = 4, 16
# session 6, second sweep (the first one, 1-tile to 32-tile loops, is in notes/w35_perf.md)
QK_CONFIGS = [(128, 128, 16, 3, 8), (128, 128, 32, 3, 8), (128, 128, 16, 4, 8), (128, 128, 8, 3, 8),
              (128, 64, 16, 3, 4), (128, 64, 32, 3, 4), (128, 64, 16, 4, 4), (128, 64, 16, 3, 8),
              (64, 128, 16, 3, 4), (128, 128, 16, 3, 4), (256, 64, 16, 3, 8), (128, 64, 8, 4, 4)]


def part_qk():
    for n, d in ((4096, 128), (4096, 64), (1024, 128)):
        q, k = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        out = torch.empty(B, H, n, n, device="cuda", dtype=torch.bfloat16)
        want = torch.matmul(q, k.transpose(-1, -2))
        flops = ref.qk_cost(B * H, n, n, d, 2)["flops"]
        peer = flops / bench.gpu_ms(lambda: torch.matmul(q, k.transpose(-1, -2), out=out), rep_ms=60) / 1e9
        print(f"qk N={n} d={d}: torch.matmul {peer:.0f} TFLOP/s")
        for bm, bn, tiles, stages, warps in QK_CONFIGS:
            def run():
                grid = (triton.cdiv(n, bn * tiles), triton.cdiv(n, bm), B * H)
                s.qk_scores_kernel[grid](q, k, out, n, n, d, H, 1.0, *q.stride()[:3], *k.stride()[:3], BLOCK_M=bm,
                                         BLOCK_N=bn, BLOCK_D=d, TILES=tiles, STAGES=stages, PRECISION="tf32",
                                         num_warps=warps)
            name = f"BM={bm} BN={bn} tiles={tiles} stages={stages} warps={warps}"
            try:
                out.zero_()
                run()
                torch.cuda.synchronize()
                err = (out.float() - want.float()).abs().max().item()
                tf = flops / bench.gpu_ms(run, rep_ms=60) / 1e9
                print(f"  {name}: {tf:.0f} TFLOP/s ({tf / peer:.2f}x) err {err:.3g}")
            except Exception as exc:  # noqa: BLE001 - a config that does not fit is reported
                print(f"  {name}: {type(exc).__name__} {str(exc)[:80]}")
        del q, k, out, want


def part_pv():
    for n, d in ((4096, 128), (4096, 64), (1024, 128)):
        p = torch.softmax(torch.randn(B, H, n, n, device="cuda"), -1).to(torch.bfloat16)
        v = torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(B, H, n, d, device="cuda", dtype=torch.bfloat16)
        want = torch.matmul(p, v)
        flops = 2 * B * H * n * n * d
        peer = flops / bench.gpu_ms(lambda: torch.matmul(p, v, out=out), rep_ms=60) / 1e9
        print(f"pv N={n} d={d}: torch.matmul {peer:.0f} TFLOP/s")
        for bm, bn, warps, stages in [(128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3),
                                      (64, 128, 4, 3), (128, 64, 8, 4), (256, 64, 8, 3), (128, 32, 4, 4)]:
            def run():
                s.pv_kernel[(triton.cdiv(n, bm), B * H)](p, v, out, n, n, d, H, p.stride(2), *v.stride()[:3],
                                                         BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=d, CAUSAL=False,
                                                         PRECISION="tf32", num_warps=warps, num_stages=stages)
            try:
                run()
                torch.cuda.synchronize()
                err = (out.float() - want.float()).abs().max().item()
                tf = flops / bench.gpu_ms(run, rep_ms=60) / 1e9
                print(f"  BM={bm} BN={bn} warps={warps} stages={stages}: {tf:.0f} TFLOP/s ({tf / peer:.2f}x) err {err:.3g}")
            except Exception as exc:  # noqa: BLE001
                print(f"  BM={bm} BN={bn} warps={warps} stages={stages}: {type(exc).__name__} {str(exc)[:80]}")
        del p, v, out, want


@triton.jit
def softmax_variant(s_ptr, p_ptr, M, N, scale, BLOCK_N: tl.constexpr, LOAD: tl.constexpr):
    # causal scale + softmax of contiguous rows; LOAD 0: the whole row, 1: the kept prefix rounded up to 16
    # keys, 2: the exact prefix. Same math as scale_mask_softmax_kernel.
    row = tl.program_id(0)
    i = row % M
    cols = tl.arange(0, BLOCK_N)
    end = tl.minimum(N, i + 1)
    keep = cols < end
    if LOAD == 0:
        loaded = cols < N
    elif LOAD == 1:
        loaded = cols < tl.minimum(tl.cdiv(end, 16) * 16, N)
    else:
        loaded = keep
    x = tl.load(s_ptr + row.to(tl.int64) * N + cols, mask=loaded, other=0.0).to(tl.float32) * scale
    x = tl.where(keep, x, -float("inf"))
    e = tl.where(keep, tl.exp(x - tl.max(x, axis=0)), 0.0)
    tl.store(p_ptr + row.to(tl.int64) * N + cols, (e / tl.sum(e, axis=0)).to(p_ptr.dtype.element_ty), mask=cols < N)


def part_causal():
    copy = bench.copy_ceiling_gbps()
    for n in (2048, 4096):
        scores = torch.randn(B, H, n, n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(scores)
        want = torch.softmax((scores.float() * 0.088).masked_fill(~torch.ones(n, n, dtype=torch.bool, device="cuda").tril(),
                                                                 float("-inf")), -1)
        for load in (0, 1, 2):
            nbytes = B * H * ((n * n if load == 0 else n * (n + 1) // 2) + n * n) * 2
            for warps in (2, 4, 8):
                def run():
                    softmax_variant[(B * H * n,)](scores, out, n, n, 0.088, BLOCK_N=n, LOAD=load, num_warps=warps)
                run()
                err = (out.float() - want).abs().max().item()
                ms = bench.gpu_ms(run, rep_ms=60)
                print(f"causal N={n} load={load} warps={warps}: {ms:.3f} ms, {nbytes / ms / 1e6:.0f} GB/s "
                      f"({nbytes / ms / 1e6 / copy:.3f} of copy) err {err:.2g}")
        del scores, out, want


def part_softmax():
    copy = bench.copy_ceiling_gbps()
    for n in (1024, 2048, 4096):
        for src_dtype in (torch.bfloat16, torch.float32):
            scores = torch.randn(B, H, n, n, device="cuda", dtype=src_dtype)
            out = torch.empty(B, H, n, n, device="cuda", dtype=torch.bfloat16)
            for causal in (False, True):
                nbytes = B * H * (sum(min(i + 1, n) for i in range(n)) if causal else n * n) * scores.element_size() \
                    + B * H * n * n * 2
                for warps in (1, 2, 4, 8):
                    def run():
                        s.scale_mask_softmax_kernel[(B * H * n,)](scores, out, scores, scores, n, n, H, 0.088,
                                                                  *scores.stride()[:3], n,
                                                                  BLOCK_N=triton.next_power_of_2(n), CAUSAL=causal,
                                                                  HAS_LENGTHS=False, HAS_ALIBI=False, num_warps=warps)
                    gbps = nbytes / bench.gpu_ms(run, rep_ms=60) / 1e6
                    print(f"softmax N={n} {str(src_dtype)[6:]} causal={causal} warps={warps}: {gbps:.0f} GB/s "
                          f"({gbps / copy:.3f} of copy)")
            del scores, out


if __name__ == "__main__":
    for part in sys.argv[1:] or ["qk", "pv", "softmax"]:
        globals()[f"part_{part}"]()
