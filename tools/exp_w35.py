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
    _qk_sweep("qk", ((4096, 128), (4096, 64), (1024, 128)),
              [(s.qk_scores_kernel, cfg, {"PRECISION": "tf32"}) for cfg in QK_CONFIGS], reps=1)


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


@triton.jit
def softmax_fast(s_ptr, p_ptr, M, N, scale, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # the one-block kernel with fewer instructions per key: one where, and p = e · (1 / sum)
    row = tl.program_id(0)
    i = row % M
    cols = tl.arange(0, BLOCK_N)
    end = tl.minimum(N, i + 1) if CAUSAL else N
    loaded = cols < tl.minimum(tl.cdiv(end, 16) * 16, N)
    s = tl.load(s_ptr + row.to(tl.int64) * N + cols, mask=loaded, other=0.0).to(tl.float32)
    x = tl.where(cols < end, s * scale, -float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    p = e * (1.0 / tl.sum(e, axis=0))
    tl.store(p_ptr + row.to(tl.int64) * N + cols, p.to(p_ptr.dtype.element_ty), mask=cols < N)


@triton.jit
def softmax_chunked(s_ptr, p_ptr, M, N, scale, p_row_stride, CHUNK: tl.constexpr, CAUSAL: tl.constexpr,
                    LANE_STATE: tl.constexpr):
    # two passes over the kept prefix in CHUNK-key pieces: (m, l) online (per chunk or per lane), then
    # p = exp(x - m) / l; the masked tail is written as zeros without reading it. A barrier between each
    # chunk's load and store keeps the in-place fp32 -> 16-bit case race-free.
    row = tl.program_id(0)
    i = row % M
    cols = tl.arange(0, CHUNK)
    end = tl.minimum(N, i + 1) if CAUSAL else N
    s_row = s_ptr + row.to(tl.int64) * N
    p_row = p_ptr + row.to(tl.int64) * p_row_stride
    if LANE_STATE:
        m = tl.full([CHUNK], -float("inf"), tl.float32)
        l = tl.zeros([CHUNK], tl.float32)
        for start in tl.range(0, end, CHUNK):
            x = tl.load(s_row + start + cols, mask=start + cols < end, other=-float("inf")).to(tl.float32) * scale
            m_new = tl.maximum(m, x)
            l = l * tl.exp(tl.where(m_new == -float("inf"), 0.0, m - m_new)) + tl.exp(x - tl.where(m_new == -float("inf"), 0.0, m_new))
            m = m_new
        top = tl.max(m, axis=0)
        total = tl.sum(l * tl.exp(m - top), axis=0)
    else:
        top = -float("inf")
        total = 0.0
        for start in tl.range(0, end, CHUNK):
            x = tl.load(s_row + start + cols, mask=start + cols < end, other=-float("inf")).to(tl.float32) * scale
            new_top = tl.maximum(top, tl.max(x, axis=0))
            total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), axis=0)
            top = new_top
    inv = 1.0 / total
    for start in tl.range(0, end, CHUNK):
        x = tl.load(s_row + start + cols, mask=start + cols < end, other=-float("inf")).to(tl.float32) * scale
        tl.debug_barrier()
        tl.store(p_row + start + cols, (tl.exp(x - top) * inv).to(p_ptr.dtype.element_ty), mask=start + cols < N)
    for start in tl.range(tl.cdiv(end, CHUNK) * CHUNK, N, CHUNK):
        tl.store(p_row + start + cols, tl.zeros([CHUNK], tl.float32).to(p_ptr.dtype.element_ty), mask=start + cols < N)


def part_softmax2():
    """The fused softmax's variants against the solution kernel: bf16 scores -> bf16 p, and float32
    scores -> bf16 p written in place (the composed attention's case)."""
    copy = bench.copy_ceiling_gbps()
    print(f"copy ceiling {copy:.0f} GB/s")
    for n in (1024, 2048, 4096):
        for src_dtype in (torch.bfloat16, torch.float32):
            scores = torch.randn(B, H, n, n, device="cuda", dtype=src_dtype) * 3
            out = torch.empty(B, H, n, n, device="cuda", dtype=torch.bfloat16)
            for causal in (False, True):
                keep = torch.ones(n, n, dtype=torch.bool, device="cuda").tril() if causal else None
                x = scores.float() * 0.088
                want = torch.softmax(x.masked_fill(~keep, float("-inf")) if causal else x, -1)
                del x
                kept = B * H * (n * (n + 1) // 2 if causal else n * n)
                nbytes = kept * scores.element_size() + B * H * n * n * 2
                variants = {"solution": lambda: s.scale_mask_softmax_kernel[(B * H * n,)](
                    scores, out, scores, scores, n, n, H, 0.088, *scores.stride()[:3], n,
                    BLOCK_N=triton.next_power_of_2(n), CAUSAL=causal, HAS_LENGTHS=False, HAS_ALIBI=False,
                    num_warps=max(2, min(16, n * scores.element_size() // 2048)))}
                for warps in (2, 4, 8):
                    variants[f"fast w{warps}"] = (lambda w: lambda: softmax_fast[(B * H * n,)](
                        scores, out, n, n, 0.088, BLOCK_N=n, CAUSAL=causal, num_warps=w))(warps)
                for chunk in (512, 1024, 2048):
                    for warps in (2, 4, 8):
                        for lane in (0, 1):
                            if chunk // (32 * warps) < 4:
                                continue
                            variants[f"chunked C{chunk} w{warps} lane{lane}"] = (lambda c, w, ls: lambda: softmax_chunked[(B * H * n,)](
                                scores, out, n, n, 0.088, n, CHUNK=c, CAUSAL=causal, LANE_STATE=ls, num_warps=w))(chunk, warps, lane)
                for name, run in variants.items():
                    out.fill_(float("nan"))
                    run()
                    err = (out.float() - want).abs().max().item()
                    gbps = nbytes / bench.gpu_ms(run, rep_ms=40) / 1e6
                    print(f"softmax2 N={n} {str(src_dtype)[6:]} causal={causal} {name}: {gbps:.0f} GB/s "
                          f"({gbps / copy:.3f} of copy) err {err:.2g}")
                if src_dtype == torch.float32:  # in place: p overwrites the front of each float32 row
                    for chunk, warps in ((1024, 4), (2048, 8)):
                        work = scores.clone()
                        softmax_chunked[(B * H * n,)](work, work.view(torch.bfloat16), n, n, 0.088, 2 * n,
                                                      CHUNK=chunk, CAUSAL=causal, LANE_STATE=0, num_warps=warps)
                        got = work.view(torch.bfloat16)[..., :n].float()
                        print(f"  in place C{chunk} w{warps}: err {(got - want).abs().max().item():.2g}")
                        del work
                del want
            del scores, out


@triton.jit
def qk_variant(q_ptr, k_ptr, s_ptr, M, N, D, H, scale, sqb, sqh, sqm, skb, skh, skn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, TILES: tl.constexpr,
               STAGES: tl.constexpr, STORE: tl.constexpr):
    # qk_scores_kernel with other stores: STORE 0 plain, 1 streaming (.cs), 2 a TMA tensor descriptor
    pid_n, pid_m, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    s_rows = s_ptr + bh.to(tl.int64) * M * N + rows[:, None] * N
    q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :],
                mask=(rows[:, None] < M) & (dims[None, :] < D), other=0.0)
    if STORE == 2:
        desc = tl.make_tensor_descriptor(s_ptr + bh.to(tl.int64) * M * N, shape=[M, N], strides=[N, 1],
                                         block_shape=[BLOCK_M, BLOCK_N])
    for t in tl.range(0, TILES, num_stages=STAGES):
        cols = (pid_n * TILES + t) * BLOCK_N + tl.arange(0, BLOCK_N)
        k_t = tl.load(k_ptr + b * skb + h * skh + cols[None, :] * skn + dims[:, None],
                      mask=(cols[None, :] < N) & (dims[:, None] < D), other=0.0)
        s = (tl.dot(q, k_t) * scale).to(s_ptr.dtype.element_ty)
        if STORE == 2:
            desc.store([pid_m * BLOCK_M, (pid_n * TILES + t) * BLOCK_N], s)
        elif STORE == 1:
            tl.store(s_rows + cols[None, :], s, mask=(rows[:, None] < M) & (cols[None, :] < N), cache_modifier=".cs")
        else:
            tl.store(s_rows + cols[None, :], s, mask=(rows[:, None] < M) & (cols[None, :] < N))


def _qk_sweep(tag, sizes, variants, reps=2):
    """Time each (kernel, (BLOCK_M, BLOCK_N, TILES, STAGES, warps), extra constexprs) against torch.matmul,
    measured again before each repetition (its rate varies from run to run); checked before timing."""
    for n, d in sizes:
        q, k = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        out = torch.empty(B, H, n, n, device="cuda", dtype=torch.bfloat16)
        want = torch.matmul(q, k.transpose(-1, -2))
        flops = ref.qk_cost(B * H, n, n, d, 2)["flops"]
        for _ in range(reps):
            peer = flops / bench.gpu_ms(lambda: torch.matmul(q, k.transpose(-1, -2), out=out), rep_ms=60) / 1e9
            print(f"{tag} N={n} d={d}: torch.matmul {peer:.0f} TFLOP/s")
            for kernel, (bm, bn, tiles, stages, warps), extra in variants:
                def run():
                    grid = (triton.cdiv(n, bn * tiles), triton.cdiv(n, bm), B * H)
                    kernel[grid](q, k, out, n, n, d, H, 1.0, *q.stride()[:3], *k.stride()[:3], BLOCK_M=bm,
                                 BLOCK_N=bn, BLOCK_D=d, TILES=tiles, STAGES=stages, num_warps=warps, **extra)
                name = f"{kernel.fn.__name__} {extra} BM={bm} BN={bn} tiles={tiles} stages={stages} warps={warps}"
                try:
                    out.zero_()
                    run()
                    torch.cuda.synchronize()
                    err = (out.float() - want.float()).abs().max().item()
                    tf = flops / bench.gpu_ms(run, rep_ms=60) / 1e9
                    print(f"  {name}: {tf:.0f} TFLOP/s ({tf / peer:.2f}x) err {err:.3g}")
                except Exception as exc:  # noqa: BLE001 - a config that does not compile is reported
                    print(f"  {name}: {type(exc).__name__} {str(exc)[:120]}")
        del q, k, out, want


def part_qk2():
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    _qk_sweep("qk2", ((4096, 128), (4096, 64), (1024, 128), (1024, 64)),
              [(qk_variant, cfg, {"STORE": store}) for cfg in ((128, 64, 16, 3, 8), (128, 128, 16, 3, 8), (128, 64, 8, 3, 8))
               for store in (0, 1, 2)])


@triton.jit
def _prefix_probs(s_row, cols, end, n, scale, EVICT: tl.constexpr):
    # probabilities of one row over `cols`, the keys j < end kept (loads rounded up to 16 keys)
    loaded = cols < tl.minimum(tl.cdiv(end, 16) * 16, n)
    if EVICT:
        s = tl.load(s_row + cols, mask=loaded, other=0.0, eviction_policy="evict_first").to(tl.float32)
    else:
        s = tl.load(s_row + cols, mask=loaded, other=0.0).to(tl.float32)
    x = tl.where(cols < end, s * scale, -float("inf"))
    top = tl.max(x, axis=0)
    e = tl.exp(x - tl.where(top == -float("inf"), 0.0, top))
    return e * (1.0 / tl.maximum(tl.sum(e, axis=0), 1e-30))


@triton.jit
def softmax_split(s_ptr, p_ptr, M, N, scale, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, SPLITS: tl.constexpr,
                  EVICT: tl.constexpr, STREAM: tl.constexpr):
    # softmax_fast, plus: a row whose kept keys fit in BLOCK_N/2 (or /4) computes only that part and
    # stores zeros after it, so a causal row costs instructions in proportion to its kept keys.
    row = tl.program_id(0)
    i = row % M
    end = tl.minimum(N, i + 1) if CAUSAL else N
    s_row = s_ptr + row.to(tl.int64) * N
    p_row = p_ptr + row.to(tl.int64) * N
    cols = tl.arange(0, BLOCK_N)
    if SPLITS >= 2 and end <= BLOCK_N // 4 and SPLITS == 4:
        q = tl.arange(0, BLOCK_N // 4)
        tl.store(p_row + q, _prefix_probs(s_row, q, end, N, scale, EVICT).to(p_ptr.dtype.element_ty), mask=q < N)
        tl.store(p_row + cols, tl.zeros([BLOCK_N], p_ptr.dtype.element_ty), mask=(cols >= BLOCK_N // 4) & (cols < N))
    elif SPLITS >= 2 and end <= BLOCK_N // 2:
        half = tl.arange(0, BLOCK_N // 2)
        tl.store(p_row + half, _prefix_probs(s_row, half, end, N, scale, EVICT).to(p_ptr.dtype.element_ty), mask=half < N)
        tl.store(p_row + BLOCK_N // 2 + half, tl.zeros([BLOCK_N // 2], p_ptr.dtype.element_ty), mask=BLOCK_N // 2 + half < N)
    else:
        p = _prefix_probs(s_row, cols, end, N, scale, EVICT).to(p_ptr.dtype.element_ty)
        if STREAM:
            tl.store(p_row + cols, p, mask=cols < N, cache_modifier=".cs")
        else:
            tl.store(p_row + cols, p, mask=cols < N)


def part_softmax3():
    copy = bench.copy_ceiling_gbps()
    print(f"copy ceiling {copy:.0f} GB/s")
    for n in (1024, 2048, 4096):
        for src_dtype in (torch.bfloat16, torch.float32):
            scores = torch.randn(B, H, n, n, device="cuda", dtype=src_dtype) * 3
            out = torch.empty(B, H, n, n, device="cuda", dtype=torch.bfloat16)
            for causal in (False, True):
                keep = torch.ones(n, n, dtype=torch.bool, device="cuda").tril() if causal else None
                x = scores.float() * 0.088
                want = torch.softmax(x.masked_fill(~keep, float("-inf")) if causal else x, -1)
                del x
                kept = B * H * (n * (n + 1) // 2 if causal else n * n)
                nbytes = kept * scores.element_size() + B * H * n * n * 2
                base = max(2, min(16, n * scores.element_size() // 2048))
                for warps in sorted({base, 2 * base, max(1, base // 2)}):
                    for splits, evict, stream in ((1, 0, 0), (2, 0, 0), (4, 0, 0), (1, 1, 0), (1, 0, 1), (2, 1, 1), (4, 1, 1)):
                        if not causal and splits > 1:
                            continue
                        def run():
                            softmax_split[(B * H * n,)](scores, out, n, n, 0.088, BLOCK_N=n, CAUSAL=causal,
                                                        SPLITS=splits, EVICT=evict, STREAM=stream, num_warps=warps)
                        out.fill_(float("nan"))
                        run()
                        err = (out.float() - want).abs().max().item()
                        gbps = nbytes / bench.gpu_ms(run, rep_ms=40) / 1e6
                        print(f"softmax3 N={n} {str(src_dtype)[6:]} causal={causal} w{warps} splits={splits} "
                              f"evict={evict} stream={stream}: {gbps:.0f} GB/s ({gbps / copy:.3f} of copy) err {err:.2g}")
                del want
            del scores, out


QK3_CONFIGS = [(128, 64, 16, 3, 8), (128, 64, 16, 2, 8), (128, 64, 16, 2, 4), (128, 64, 16, 3, 4), (64, 64, 16, 3, 4),
               (64, 128, 16, 2, 4), (64, 128, 8, 3, 4), (128, 64, 32, 2, 8), (256, 64, 16, 2, 8), (128, 32, 16, 3, 4),
               (64, 64, 32, 3, 4), (64, 64, 16, 4, 4)]


def part_qk3():
    _qk_sweep("qk3", ((4096, 128), (1024, 128)),
              [(qk_variant, cfg, {"STORE": store}) for cfg in QK3_CONFIGS for store in (0, 1)])


@triton.jit
def qk_lag(q_ptr, k_ptr, s_ptr, M, N, D, H, scale, sqb, sqh, sqm, skb, skh, skn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, TILES: tl.constexpr,
           STAGES: tl.constexpr, STREAM: tl.constexpr):
    # qk_scores_kernel, software-pipelined by hand: tile t+1's dot is issued before tile t is stored
    pid_n, pid_m, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    s_rows = s_ptr + bh.to(tl.int64) * M * N + rows[:, None] * N
    q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :],
                mask=(rows[:, None] < M) & (dims[None, :] < D), other=0.0)
    k_base = k_ptr + b * skb + h * skh
    cols = pid_n * TILES * BLOCK_N + tl.arange(0, BLOCK_N)
    k_t = tl.load(k_base + cols[None, :] * skn + dims[:, None], mask=(cols[None, :] < N) & (dims[:, None] < D), other=0.0)
    s = (tl.dot(q, k_t) * scale).to(s_ptr.dtype.element_ty)
    for t in tl.range(1, TILES, num_stages=STAGES):
        nxt_cols = cols + BLOCK_N
        k_t = tl.load(k_base + nxt_cols[None, :] * skn + dims[:, None], mask=(nxt_cols[None, :] < N) & (dims[:, None] < D), other=0.0)
        nxt = (tl.dot(q, k_t) * scale).to(s_ptr.dtype.element_ty)
        if STREAM:
            tl.store(s_rows + cols[None, :], s, mask=(rows[:, None] < M) & (cols[None, :] < N), cache_modifier=".cs")
        else:
            tl.store(s_rows + cols[None, :], s, mask=(rows[:, None] < M) & (cols[None, :] < N))
        s = nxt
        cols = nxt_cols
    tl.store(s_rows + cols[None, :], s, mask=(rows[:, None] < M) & (cols[None, :] < N))


def part_qk4():
    configs = ((128, 64, 16, 3, 8), (128, 64, 8, 3, 8), (128, 128, 8, 3, 8), (64, 64, 16, 3, 4), (256, 64, 16, 2, 8),
               (128, 64, 16, 2, 8), (128, 64, 16, 3, 4), (128, 128, 16, 2, 8))
    _qk_sweep("qk4", ((4096, 128), (1024, 128), (4096, 64)),
              [(kernel, cfg, extra) for cfg in configs
               for kernel, extra in ((qk_variant, {"STORE": 0}), (qk_lag, {"STREAM": 0}), (qk_lag, {"STREAM": 1}))])


@triton.jit
def qk_lag2(q_ptr, k_ptr, s_ptr, M, N, D, H, scale, sqb, sqh, sqm, skb, skh, skn,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, TILES: tl.constexpr,
            STAGES: tl.constexpr):
    # qk_lag with the raw float32 accumulator carried: tile t+1's dot stays in flight while tile t is
    # scaled, rounded and stored
    pid_n, pid_m, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    s_rows = s_ptr + bh.to(tl.int64) * M * N + rows[:, None] * N
    q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :],
                mask=(rows[:, None] < M) & (dims[None, :] < D), other=0.0)
    k_base = k_ptr + b * skb + h * skh
    cols = pid_n * TILES * BLOCK_N + tl.arange(0, BLOCK_N)
    k_t = tl.load(k_base + cols[None, :] * skn + dims[:, None], mask=(cols[None, :] < N) & (dims[:, None] < D), other=0.0)
    acc = tl.dot(q, k_t)
    for t in tl.range(1, TILES, num_stages=STAGES):
        nxt_cols = cols + BLOCK_N
        k_t = tl.load(k_base + nxt_cols[None, :] * skn + dims[:, None], mask=(nxt_cols[None, :] < N) & (dims[:, None] < D), other=0.0)
        nxt = tl.dot(q, k_t)
        tl.store(s_rows + cols[None, :], (acc * scale).to(s_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))
        acc = nxt
        cols = nxt_cols
    tl.store(s_rows + cols[None, :], (acc * scale).to(s_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def part_qk5():
    _qk_sweep("qk5", ((4096, 128), (1024, 128)),
              [(qk_variant, cfg, {"STORE": 0}) for cfg in ((128, 64, 16, 3, 8), (128, 64, 16, 4, 8), (128, 64, 16, 5, 8),
                                                           (128, 64, 16, 4, 4))]
              + [(qk_lag2, cfg, {}) for cfg in ((128, 64, 16, 3, 8), (128, 64, 16, 4, 8), (128, 64, 16, 3, 4),
                                               (128, 128, 16, 3, 8), (64, 64, 16, 3, 4), (128, 64, 8, 3, 8))])


if __name__ == "__main__":
    for part in sys.argv[1:] or ["qk", "pv", "softmax"]:
        globals()[f"part_{part}"]()
