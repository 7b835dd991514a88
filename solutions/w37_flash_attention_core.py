"""Week 37 — FlashAttention core: reference solutions of every graded exercise.

Each part a learner writes sits between BEGIN SOLUTION / END SOLUTION markers; the stubs in
course/exercises/w37_flash_attention_core.py are generated from this file (`python -m course stubs`).
Tensors are (batch, heads, length, head_dim) with any strides and a contiguous last dimension. Causal
masks are aligned top-left (query i sees keys j <= i), as in weeks 35 and 36.
"""
import math

import numpy as np
import torch
import triton
import triton.language as tl

from course.backend import ON_GPU
from course.heads import as_heads

LOG2E = 1.4426950408889634


# ---------------------------------------------------------------- day 2: the online tile update, in NumPy
def online_update(m, l, o, s, v):
    """One key tile of the online softmax for a block of Br queries: running max m (Br,), running sum l (Br,)
    and normalised output o (Br, d) so far; s (Br, Bc) the tile's scaled scores (-inf where masked) and
    v (Bc, d) its values. Returns the updated (m, l, o). A row that has seen no key yet keeps m = -inf,
    l = 0, o = 0."""
    ### BEGIN SOLUTION
    m_new = np.maximum(m, s.max(axis=1))
    shift = np.where(m_new == -np.inf, 0.0, m_new)   # no key yet: exp(-inf - 0) = 0, never exp(NaN)
    p = np.exp(s - shift[:, None])
    alpha = np.exp(m - shift)
    l_new = alpha * l + p.sum(axis=1)
    o_new = (o * (alpha * l)[:, None] + p @ v) / np.where(l_new > 0, l_new, 1.0)[:, None]
    ### END SOLUTION
    return m_new, l_new, o_new


# ---------------------------------------------------------------- day 2: the tiled forward, in NumPy
def tiled_attention(q, k, v, block_m: int, block_n: int, causal: bool = False):
    """FlashAttention's forward on (B, H, M, d) queries and (B, H, N, d) keys and values, scale 1/sqrt(d):
    each block of block_m queries streams the key blocks of block_n keys past it with online_update, never
    holding more than one (block_m, block_n) tile of scores. Returns (o, lse): o (B, H, M, d) and the natural
    log of each query's sum of exp(scores), (B, H, M)."""
    b, h, m, d = q.shape
    n = k.shape[2]
    o, lse = np.zeros(q.shape), np.zeros((b, h, m))
    ### BEGIN SOLUTION
    scale = 1 / math.sqrt(d)
    for z in np.ndindex(b, h):
        for first in range(0, m, block_m):
            rows = np.arange(first, min(first + block_m, m))
            m_i, l_i, o_i = np.full(len(rows), -np.inf), np.zeros(len(rows)), np.zeros((len(rows), d))
            last = min(first + block_m, n) if causal else n   # causal: no key after the block's last query
            for start in range(0, last, block_n):
                cols = np.arange(start, min(start + block_n, n))
                s = scale * (q[z][rows] @ k[z][cols].T)
                if causal:
                    s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)
                m_i, l_i, o_i = online_update(m_i, l_i, o_i, s, v[z][cols])
            o[z][rows] = o_i
            lse[z][rows] = m_i + np.log(l_i)
    ### END SOLUTION
    return o, lse


# ---------------------------------------------------------------- day 1: HBM traffic, counted
def hbm_traffic(bh: int, m: int, n: int, d: int, block_m: int, block_n: int, causal: bool = False):
    """(reads, writes), in elements, of the tiled forward for bh heads: Q read once; K and V read once per
    query block, only up to the block's last query with a causal mask (a partial last block counts its keys);
    O written once and one log-sum-exp per query."""
    ### BEGIN SOLUTION
    keys = 0
    for first in range(0, m, block_m):
        keys += min(first + block_m, n) if causal else n
    reads = bh * (m * d + 2 * keys * d)
    writes = bh * (m * d + m)
    ### END SOLUTION
    return reads, writes


# ---------------------------------------------------------------- day 5: causal tile bounds
def causal_tile_bounds(pid_m: int, block_m: int, block_n: int, n: int):
    """(free, stop) for query block pid_m of block_m queries under a top-left causal mask over n keys: the key
    blocks of block_n keys in [0, free) need no mask (whole blocks, every key before every query of the
    block); [free, stop) need one (the diagonal and the tail); keys from stop on are never loaded."""
    ### BEGIN SOLUTION
    free = min(pid_m * block_m, n) // block_n * block_n
    stop = min((pid_m + 1) * block_m, n)
    ### END SOLUTION
    return free, stop


# ---------------------------------------------------------------- day 4: the Triton forward


@triton.jit
def _attend_blocks(acc, m_i, l_i, q, k_head, v_head, rows, dims, start, stop, N, D, skn, svn, qk_scale,
                   BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, STAGES: tl.constexpr,
                   PRECISION: tl.constexpr):
    # The key blocks [start, stop) of one query block: per block, S = Q Kᵀ in base-2 units, the running
    # max m and sum l updated online, the accumulator rescaled and P V added. MASKED: the blocks may hold
    # keys past N or (CAUSAL) keys after a query; unmasked blocks skip the compares.
    ### BEGIN SOLUTION
    for begin in tl.range(start, stop, BLOCK_N, num_stages=STAGES):
        cols = begin + tl.arange(0, BLOCK_N)
        k_t = tl.load(k_head + cols[None, :] * skn + dims[:, None], mask=(cols[None, :] < N) & (dims[:, None] < D),
                      other=0.0)
        s = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale
        if MASKED:
            keep = cols[None, :] < N
            if CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None])
            s = tl.where(keep, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # a row with no key yet: exp2(-inf - 0) = 0
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_head + cols[:, None] * svn + dims[None, :], mask=(cols[:, None] < N) & (dims[None, :] < D),
                    other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    ### END SOLUTION
    return acc, m_i, l_i


@triton.jit
def flash_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, M, N, D, H, qk_scale,
                           sqb, sqh, sqm, skb, skh, skn, svb, svh, svn,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                           CAUSAL: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # Program (query block, b·H + h) keeps BLOCK_M queries on chip and streams the key and value blocks
    # past them: reads Q once and K, V once per query block (causal: only blocks up to the diagonal),
    # writes O (contiguous) and the natural-log LSE of each query (float32, (B·H, M)).
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + b.to(tl.int64) * sqb + h * sqh + rows[:, None] * sqm + dims[None, :],
                mask=(rows[:, None] < M) & (dims[None, :] < D), other=0.0)
    k_head = k_ptr + b.to(tl.int64) * skb + h * skh
    v_head = v_ptr + b.to(tl.int64) * svb + h * svh
    ### BEGIN SOLUTION
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    ### END SOLUTION
    # Blocks wholly below the diagonal and inside N need no mask; the rest (the diagonal, the tail) do.
    if CAUSAL:
        free = tl.minimum(pid_m * BLOCK_M, N) // BLOCK_N * BLOCK_N
        stop = tl.minimum((pid_m + 1) * BLOCK_M, N)
    else:
        free = N // BLOCK_N * BLOCK_N
        stop = N
    acc, m_i, l_i = _attend_blocks(acc, m_i, l_i, q, k_head, v_head, rows, dims, 0, free, N, D, skn, svn, qk_scale,
                                   BLOCK_N, False, CAUSAL, STAGES, PRECISION)
    acc, m_i, l_i = _attend_blocks(acc, m_i, l_i, q, k_head, v_head, rows, dims, free, stop, N, D, skn, svn,
                                   qk_scale, BLOCK_N, True, CAUSAL, STAGES, PRECISION)
    ### BEGIN SOLUTION
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    lse = tl.where(l_i > 0, (m_i + tl.log2(l_safe)) / 1.4426950408889634, -float("inf"))  # natural log
    ### END SOLUTION
    o_rows = o_ptr + bh.to(tl.int64) * M * D + rows[:, None] * D + dims[None, :]
    tl.store(o_rows, o.to(o_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (dims[None, :] < D))
    tl.store(lse_ptr + bh.to(tl.int64) * M + rows, lse, mask=rows < M)


# (BLOCK_M, BLOCK_N, num_warps, STAGES) per head dimension on a GPU (tools/exp_w37.py); small tiles on CPU
GPU_TILES = {64: (128, 64, 8, 3), 128: (128, 64, 8, 3)}
CPU_TILES = (32, 16, 4, 1)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale=None,
                    tiles=None):
    """softmax(scale · q kᵀ, causal or not) v without the (M, N) matrix: (o, lse), o (B, H, M, d) in q's dtype,
    lse (B, H, M) float32, the natural log of each row's sum of exp(scale · q·k)."""
    q, k, v = (as_heads(t, "flash_attention", name) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    (bsz, heads, m, d), n = q.shape, k.shape[2]
    if k.shape != (bsz, heads, n, d) or v.shape != k.shape or not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"flash_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} must share "
                         f"batch, heads, head_dim and dtype; k and v must have the same shape")
    if d > 256:
        raise ValueError(f"flash_attention: head_dim {d} is larger than the kernel's 256")
    scale = 1 / math.sqrt(d) if scale is None else float(scale)
    block_d = max(16, triton.next_power_of_2(d))
    block_m, block_n, warps, stages = tiles or (GPU_TILES.get(block_d, (64, 64, 4, 2)) if ON_GPU else CPU_TILES)
    o = torch.empty((bsz, heads, m, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((bsz, heads, m), dtype=torch.float32, device=q.device)
    flash_attention_kernel[(triton.cdiv(m, block_m), bsz * heads)](
        q, k, v, o, lse, m, n, d, heads, scale * LOG2E, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, CAUSAL=bool(causal), STAGES=stages,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=warps)
    return o, lse
