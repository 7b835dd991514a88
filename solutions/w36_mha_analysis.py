"""Week 36 — standard multi-head attention, analysed: reference solutions of every graded exercise.

Each part a learner writes sits between BEGIN SOLUTION / END SOLUTION markers; the stubs in
course/exercises/w36_mha_analysis.py are generated from this file (`python -m course stubs`).
Five exercises predict before measuring: FLOPs and HBM bytes of a stage, the roof that bounds it, the
largest N that fits, the bytes of the three-kernel pipeline. The graders check them against the course's
cost model, course/attention_cost.py. One exercise is a kernel: the softmax batched over all heads.
"""
import math

import torch
import triton
import triton.language as tl

from course.heads import as_heads, out_tensor


# ---------------------------------------------------------------- day 1: FLOPs and bytes of a stage
def qk_cost(bh: int, m: int, n: int, d: int, element_size: int):
    """(FLOPs, HBM bytes) of S = Q Kᵀ for bh heads of M queries and N keys of dimension d, every tensor
    element_size bytes per element, each read or written once. A multiply-add is two FLOPs."""
    ### BEGIN SOLUTION
    flops = 2 * bh * m * n * d
    nbytes = bh * (m * d + n * d + m * n) * element_size
    ### END SOLUTION
    return flops, nbytes


def pv_cost(bh: int, m: int, n: int, d: int, element_size: int):
    """(FLOPs, HBM bytes) of O = P V for bh heads: P is (M, N), V (N, d), O (M, d)."""
    ### BEGIN SOLUTION
    flops = 2 * bh * m * n * d
    nbytes = bh * (m * n + n * d + m * d) * element_size
    ### END SOLUTION
    return flops, nbytes


# ---------------------------------------------------------------- day 2: where it stops fitting
def largest_n(memory_bytes: float, bh: int, d: int, element_size: int, square_bytes: int) -> int:
    """The largest N (M = N queries and keys) whose standard attention fits in memory_bytes: Q, K, V and O
    (bh·N·d elements each, element_size bytes) plus square_bytes for every one of the bh·N² (query, key)
    pairs (the score and probability matrices alive at the peak)."""
    ### BEGIN SOLUTION
    a, b = bh * square_bytes, 4 * bh * d * element_size      # peak(N) = a·N² + b·N
    n = int((-b + math.sqrt(b * b + 4 * a * memory_bytes)) / (2 * a))
    while a * (n + 1) ** 2 + b * (n + 1) <= memory_bytes:    # floating-point rounding, either way
        n += 1
    while n > 0 and a * n * n + b * n > memory_bytes:
        n -= 1
    ### END SOLUTION
    return n


# ---------------------------------------------------------------- day 3: which roof
def roofline_bound(flops: float, nbytes: float, bandwidth_gbps: float, peak_tflops: float):
    """(arithmetic intensity in FLOP/B, the ridge point in FLOP/B, the least time in ms, 1.0 if the compute
    roof bounds the stage else 0.0) for a stage of `flops` FLOPs moving `nbytes` bytes on a machine with
    the two ceilings (GB/s = 1e9 B/s, TFLOP/s = 1e12 FLOP/s)."""
    ### BEGIN SOLUTION
    intensity = flops / nbytes
    ridge = peak_tflops * 1e12 / (bandwidth_gbps * 1e9)
    ms = max(nbytes / (bandwidth_gbps * 1e9), flops / (peak_tflops * 1e12)) * 1e3
    compute_bound = 1.0 if intensity > ridge else 0.0
    ### END SOLUTION
    return intensity, ridge, ms, compute_bound


# ---------------------------------------------------------------- day 4: the softmax batched over heads
@triton.jit
def batched_softmax_kernel(s_ptr, p_ptr, R, M, N, H, scale, ssb, ssh, ssm, p_row_stride,
                           ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # One launch for every head: program g owns the ROWS flat rows r = g·ROWS + t of all R = B·H·M score
    # rows, a [ROWS, BLOCK_N] tile; row r is query i of head (b, h), read at that head's strides and
    # written at r·p_row_stride. Reads the kept scores, writes N probabilities per row.
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    ### BEGIN SOLUTION
    live = r < R
    i = r % M
    b, h = r // M // H, r // M % H
    end = tl.full([ROWS], N, tl.int32)
    if CAUSAL:
        end = tl.minimum(end, i + 1)
    keep = (cols[None, :] < end[:, None]) & live[:, None]
    row_start = b.to(tl.int64) * ssb + h.to(tl.int64) * ssh + i.to(tl.int64) * ssm  # past 2^31 elements
    s = tl.load(s_ptr + row_start[:, None] + cols[None, :], mask=keep, other=0.0).to(tl.float32)
    x = tl.where(keep, s * scale, -float("inf"))
    top = tl.max(x, axis=1)
    top = tl.where(top == -float("inf"), 0.0, top)  # rows past R have no key
    e = tl.exp(x - top[:, None])
    total = tl.sum(e, axis=1)
    p = e * (1.0 / tl.where(total > 0, total, 1.0))[:, None]
    tl.store(p_ptr + r.to(tl.int64)[:, None] * p_row_stride + cols[None, :], p.to(p_ptr.dtype.element_ty),
             mask=live[:, None] & (cols[None, :] < N))
    ### END SOLUTION


def batched_softmax(scores: torch.Tensor, out: torch.Tensor | None = None, scale: float = 1.0,
                    causal: bool = False) -> torch.Tensor:
    """softmax(scale · scores), causal or not, over the last dimension of (B, H, M, N) scores with any
    strides, in one launch for all B·H heads. `out` may be `scores` itself (each program reads its rows
    whole before it writes them)."""
    scores = as_heads(scores, "batched_softmax", "scores")
    bsz, heads, m, n = scores.shape
    if n > 32768:
        raise ValueError(f"batched_softmax: rows of {n} keys do not fit one block (at most 32768)")
    out = out_tensor(out, scores.shape, scores, "batched_softmax", dtypes=(torch.float16, torch.bfloat16), rows=True)
    block = max(16, triton.next_power_of_2(n))
    rows = max(1, min(16, 2048 // block))  # short rows share a program: about 2048 scores per program
    total = bsz * heads * m
    batched_softmax_kernel[(triton.cdiv(total, rows),)](
        scores, out, total, m, n, heads, float(scale), *scores.stride()[:3], out.stride(2), ROWS=rows,
        BLOCK_N=block, CAUSAL=bool(causal), num_warps=4 if rows * block >= 2048 else 2)
    return out


# ---------------------------------------------------------------- day 5: bytes of the pipeline
def pipeline_bytes(bh: int, m: int, n: int, d: int, element_size: int, causal: bool = False):
    """HBM bytes of the three kernels of standard attention, (QKᵀ, fused scale + mask + softmax, PV), with
    S and P in the inputs' dtype. The softmax reads only the scores its mask keeps (causal, top-left:
    query i keeps keys j <= i) and writes every probability; the GEMMs do not skip masked work."""
    ### BEGIN SOLUTION
    k = min(m, n)
    kept = k * (k + 1) // 2 + (m - k) * n if causal else m * n
    qk = bh * ((m + n) * d + m * n) * element_size
    softmax = bh * (kept + m * n) * element_size
    pv = bh * (m * n + (n + m) * d) * element_size
    ### END SOLUTION
    return qk, softmax, pv
