"""Your exercises. Generated from solutions/w36_mha_analysis.py by `python -m course stubs`.

Replace every `YOUR CODE HERE` line with your code, then run the grading cell in the notebook
(or `python -m course grade w36.<exercise>`). The reference solutions are in solutions/w36_mha_analysis.py:
try first, peek later.
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
    # YOUR CODE HERE
    return flops, nbytes


def pv_cost(bh: int, m: int, n: int, d: int, element_size: int):
    """(FLOPs, HBM bytes) of O = P V for bh heads: P is (M, N), V (N, d), O (M, d)."""
    # YOUR CODE HERE
    return flops, nbytes


# ---------------------------------------------------------------- day 2: where it stops fitting
def largest_n(memory_bytes: float, bh: int, d: int, element_size: int, square_bytes: int) -> int:
    """The largest N (M = N queries and keys) whose standard attention fits in memory_bytes: Q, K, V and O
    (bh·N·d elements each, element_size bytes) plus square_bytes for every one of the bh·N² (query, key)
    pairs (the score and probability matrices alive at the peak)."""
    # YOUR CODE HERE
    return n


# ---------------------------------------------------------------- day 3: which roof
def roofline_bound(flops: float, nbytes: float, bandwidth_gbps: float, peak_tflops: float):
    """(arithmetic intensity in FLOP/B, the ridge point in FLOP/B, the least time in ms, 1.0 if the compute
    roof bounds the stage else 0.0) for a stage of `flops` FLOPs moving `nbytes` bytes on a machine with
    the two ceilings (GB/s = 1e9 B/s, TFLOP/s = 1e12 FLOP/s)."""
    # YOUR CODE HERE
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
    # YOUR CODE HERE


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
    # YOUR CODE HERE
    return qk, softmax, pv
