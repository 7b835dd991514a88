"""Week 38 — FlashAttention implementation: reference solutions of every graded exercise.

Each part a learner writes sits between BEGIN SOLUTION / END SOLUTION markers; the stubs in
course/exercises/w38_flash_attention_impl.py are generated from this file (`python -m course stubs`).
Dense tensors are (batch, heads, length, head_dim) with any strides and a contiguous last dimension; packed
variable-length batches are (tokens, heads, head_dim) with `cu_seqlens`. Causal masks are aligned top-left
(query i sees keys j <= i), as in weeks 35-37. Keys and values may have fewer heads than queries
(grouped-query attention): query heads kvh·G … kvh·G + G − 1 share key/value head kvh, G = H / Hkv.
"""
import math

import numpy as np
import torch
import triton
import triton.language as tl

from course.backend import ON_GPU
from course.heads import as_heads

LOG2E = 1.4426950408889634


# ---------------------------------------------------------------- day 2: the tiled backward, in NumPy
def tiled_attention_backward(q, k, v, o, do, lse, block_m: int, block_n: int, causal: bool = False):
    """The gradients (dq, dk, dv) of o = softmax(q kᵀ / sqrt(d)) v for the upstream gradient do, computed as
    FlashAttention-2's backward does: D = rowsum(do ∘ o) first; then, for each block of block_n keys, the
    blocks of block_m queries stream past it and P is recomputed tile by tile from the forward's log-sum-exp
    `lse` (B, H, M), never stored whole. (B, H, M, d) queries, (B, H, N, d) keys and values."""
    b, h, m, d = q.shape
    n = k.shape[2]
    scale = 1 / math.sqrt(d)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    ### BEGIN SOLUTION
    big_d = (do * o).sum(axis=-1)
    for z in np.ndindex(b, h):
        for first_key in range(0, n, block_n):
            cols = np.arange(first_key, min(first_key + block_n, n))
            for first in range(0, m, block_m):
                rows = np.arange(first, min(first + block_m, m))
                s = scale * (q[z][rows] @ k[z][cols].T)
                if causal:
                    s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)
                p = np.exp(s - lse[z][rows][:, None])
                dv[z][cols] += p.T @ do[z][rows]
                ds = p * (do[z][rows] @ v[z][cols].T - big_d[z][rows][:, None])
                dk[z][cols] += scale * ds.T @ q[z][rows]
                dq[z][rows] += scale * ds @ k[z][cols]
    ### END SOLUTION
    return dq, dk, dv


# ---------------------------------------------------------------- day 5: merging split-K states, in NumPy
def merge_splits(o_parts, lse_parts):
    """S partial attention results over disjoint key ranges, o_parts (S, ..., d) (each normalised by its own
    sum) and lse_parts (S, ...) (the natural log of each one's sum of exponentials), merged into the result
    over all the keys: (o, lse). A part that saw no key has lse = -inf and counts for nothing; a row that no
    part saw gets o = 0 and lse = -inf."""
    ### BEGIN SOLUTION
    top = lse_parts.max(axis=0)
    shift = np.where(np.isfinite(top), top, 0.0)       # no part saw a key: exp(-inf - 0) = 0, never NaN
    weights = np.exp(lse_parts - shift)
    total = weights.sum(axis=0)
    safe = np.where(total > 0, total, 1.0)
    o = (weights[..., None] * o_parts).sum(axis=0) / safe[..., None]
    lse = np.where(total > 0, shift + np.log(safe), -np.inf)
    ### END SOLUTION
    return o, lse


# ---------------------------------------------------------------- shared by every kernel below
def _heads(op: str, q, k, v, scale, max_d: int = 256):
    """q (B, H, M, d), k and v (B, Hkv, N, d) with Hkv dividing H, checked against each other, and the softmax
    scale (1/sqrt(d) by default)."""
    q, k, v = (as_heads(t, op, name) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    (bsz, heads, _, d), (kv_heads, n) = q.shape, k.shape[1:3]
    if k.shape != (bsz, kv_heads, n, d) or v.shape != k.shape or heads % kv_heads \
            or not q.dtype == k.dtype == v.dtype or not q.device == k.device == v.device:
        raise ValueError(f"{op}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: k and v must have the "
                         f"same shape, batch and head_dim of q, a number of heads dividing q's, and q's dtype and "
                         f"device")
    if d > max_d:
        raise ValueError(f"{op}: head_dim {d} is larger than the kernel's {max_d}")
    return q, k, v, 1 / math.sqrt(d) if scale is None else float(scale)


@triton.jit
def _sequence(cu_ptr, b, length, VARLEN: tl.constexpr):
    # (batch index for the batch stride, first row, rows) of sequence b: a dense batch entry of `length` rows,
    # or (VARLEN) rows cu[b] .. cu[b + 1] of a packed batch.
    if VARLEN:
        first = tl.load(cu_ptr + b)
        rows = tl.load(cu_ptr + b + 1) - first
        batch = b * 0
    else:
        first = b * 0
        rows = length + b * 0
        batch = b
    return batch.to(tl.int64), first.to(tl.int64), rows


# ---------------------------------------------------------------- day 5: grouped-query heads
@triton.jit
def kv_head_of(h, H, HKV):
    # The key/value head that query head h reads when H query heads share HKV key/value heads (GQA; MQA when
    # HKV = 1): groups of G = H / HKV consecutive query heads share one.
    ### BEGIN SOLUTION
    group = H // HKV
    kvh = h // group
    ### END SOLUTION
    return kvh


# ---------------------------------------------------------------- day 4: the forward, FlashAttention-2 style
@triton.jit
def _forward_blocks(acc, m_i, l_i, q, k_head, v_head, rows, dims, start, stop, N, D, skn, svn, qk_scale,
                    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, DEFER: tl.constexpr,
                    EXP2: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # Key blocks [start, stop) of one query block, online softmax. EXP2: base-2 logits (scale·log2 e folded in
    # by the caller) and exp2; else exp of natural logits. DEFER: acc holds Σ p·v, divided by l once at the
    # end (FlashAttention-2); else acc stays normalised, rescaled by l_old/l_new every block (FlashAttention-1).
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
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        if EXP2:
            p = tl.exp2(s - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
        else:
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
        l_new = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_head + cols[:, None] * svn + dims[None, :], mask=(cols[:, None] < N) & (dims[None, :] < D),
                    other=0.0)
        pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        if DEFER:
            acc = acc * alpha[:, None] + pv
        else:
            inv = 1.0 / tl.where(l_new > 0, l_new, 1.0)
            acc = acc * (alpha * l_i * inv)[:, None] + pv * inv[:, None]
        l_i, m_i = l_new, m_new
    return acc, m_i, l_i


@triton.jit
def flash_forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_ptr, M, N, D, H, HKV, qk_scale,
                         sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som, slb, slh, N_BUCKET,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                         VARLEN: tl.constexpr, SEQ_PARALLEL: tl.constexpr, DEFER: tl.constexpr, EXP2: tl.constexpr,
                         STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # Program (query block, b·H + h) keeps BLOCK_M queries on chip and streams the key/value blocks of head
    # kv_head_of(h) past them; reads Q once, K and V once per query block (causal: up to the diagonal); writes
    # O and the natural-log LSE. Without SEQ_PARALLEL one program per head walks all its query blocks
    # (FlashAttention-1's grid). VARLEN: batch entry b is rows cu[b] .. cu[b+1] of a packed batch.
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    kvh = kv_head_of(h, H, HKV)
    batch, first, m_len = _sequence(cu_ptr, b, M, VARLEN)
    if VARLEN:
        n_len = m_len
    else:
        n_len = N + 0 * m_len
    q_head = q_ptr + batch * sqb + h * sqh + first * sqm
    k_head = k_ptr + batch * skb + kvh * skh + first * skn
    v_head = v_ptr + batch * svb + kvh * svh + first * svn
    o_head = o_ptr + batch * sob + h * soh + first * som
    lse_head = lse_ptr + batch * slb + h * slh + first
    dims = tl.arange(0, BLOCK_D)
    if SEQ_PARALLEL:
        lo = tl.program_id(0)
        hi = tl.minimum(lo + 1, tl.cdiv(m_len, BLOCK_M))
    else:
        lo = 0
        hi = tl.cdiv(m_len, BLOCK_M)
    for pid_m in range(lo, hi):
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        q = tl.load(q_head + rows[:, None] * sqm + dims[None, :], mask=(rows[:, None] < m_len) & (dims[None, :] < D),
                    other=0.0)
        m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        if CAUSAL:
            free = tl.minimum(pid_m * BLOCK_M, n_len) // BLOCK_N * BLOCK_N
            stop = tl.minimum((pid_m + 1) * BLOCK_M, n_len)
        else:
            free = n_len // BLOCK_N * BLOCK_N
            stop = n_len
        acc, m_i, l_i = _forward_blocks(acc, m_i, l_i, q, k_head, v_head, rows, dims, 0, free, n_len, D, skn, svn,
                                        qk_scale, BLOCK_N, False, CAUSAL, DEFER, EXP2, STAGES, PRECISION)
        acc, m_i, l_i = _forward_blocks(acc, m_i, l_i, q, k_head, v_head, rows, dims, free, stop, n_len, D, skn, svn,
                                        qk_scale, BLOCK_N, True, CAUSAL, DEFER, EXP2, STAGES, PRECISION)
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        if DEFER:
            o = acc / l_safe[:, None]
        else:
            o = acc
        if EXP2:
            lse = tl.where(l_i > 0, (m_i + tl.log2(l_safe)) / 1.4426950408889634, -float("inf"))
        else:
            lse = tl.where(l_i > 0, m_i + tl.log(l_safe), -float("inf"))
        tl.store(o_head + rows[:, None] * som + dims[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=(rows[:, None] < m_len) & (dims[None, :] < D))
        tl.store(lse_head + rows, lse, mask=rows < m_len)


# ---------------------------------------------------------------- day 3: the backward kernels
@triton.jit
def attention_delta_kernel(o_ptr, do_ptr, delta_ptr, M, D, H, sob, soh, som, sdb, sdh, sdm,
                           BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    # The backward's preprocessing: program (query block, b·H + h) reads BLOCK_M rows of O and dO and writes
    # D = rowsum(dO ∘ O) of each, in float32, to a contiguous (B, H, M) tensor.
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    inside = (rows[:, None] < M) & (dims[None, :] < D)
    o_rows = o_ptr + b.to(tl.int64) * sob + h * soh + rows[:, None] * som + dims[None, :]
    do_rows = do_ptr + b.to(tl.int64) * sdb + h * sdh + rows[:, None] * sdm + dims[None, :]
    ### BEGIN SOLUTION
    o = tl.load(o_rows, mask=inside, other=0.0).to(tl.float32)
    do = tl.load(do_rows, mask=inside, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, axis=1)
    ### END SOLUTION
    tl.store(delta_ptr + bh.to(tl.int64) * M + rows, delta, mask=rows < M)


@triton.jit
def _dkdv_blocks(dk, dv, k, v, q_head, do_head, lse_head, delta_head, cols, dims, start, stop, M, D, sqm, sdm,
                 qk_scale, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, STAGES: tl.constexpr,
                 PRECISION: tl.constexpr):
    # One key block (k, v: BLOCK_N × BLOCK_D, on chip) against the query blocks [start, stop) of one query
    # head: Pᵀ recomputed from the saved log-sum-exp, dV += Pᵀ dO, dSᵀ = Pᵀ ∘ (dPᵀ − D), dK += dSᵀ Q (the
    # softmax scale is applied once, after the loop). MASKED: the blocks on the causal diagonal.
    ### BEGIN SOLUTION
    for begin in tl.range(start, stop, BLOCK_M, num_stages=STAGES):
        rows = begin + tl.arange(0, BLOCK_M)
        inside = (rows[:, None] < M) & (dims[None, :] < D)
        q = tl.load(q_head + rows[:, None] * sqm + dims[None, :], mask=inside, other=0.0)
        do = tl.load(do_head + rows[:, None] * sdm + dims[None, :], mask=inside, other=0.0)
        lse = tl.load(lse_head + rows, mask=rows < M, other=0.0) * 1.4426950408889634
        delta = tl.load(delta_head + rows, mask=rows < M, other=0.0)
        p_t = tl.exp2(tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale - lse[None, :])
        if MASKED:
            p_t = tl.where(cols[:, None] <= rows[None, :], p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision=PRECISION)
    ### END SOLUTION
    return dk, dv


@triton.jit
def flash_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_ptr, M, N, D, H, HKV,
                      qk_scale, sm_scale, sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdb, sdh, sdm, slb, slh,
                      sgb, sgh, sgn, N_BUCKET, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                      CAUSAL: tl.constexpr, VARLEN: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # Program (key block, b·Hkv + kvh) keeps BLOCK_N keys and values on chip and streams past them the query
    # blocks of every query head of the group (causal: only queries at or after the block's first key).
    # Reads K, V once; Q, dO, LSE, D once per key block; writes dK and dV (layout strides sg*) once: no atomics.
    pid_n, bkv = tl.program_id(0), tl.program_id(1)
    b, kvh = bkv // HKV, bkv % HKV
    batch, first, m_len = _sequence(cu_ptr, b, M, VARLEN)
    if VARLEN:
        n_len = m_len
    else:
        n_len = N + 0 * m_len
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    inside = (cols[:, None] < n_len) & (dims[None, :] < D)
    k = tl.load(k_ptr + batch * skb + kvh * skh + (first + cols[:, None]) * skn + dims[None, :], mask=inside, other=0.0)
    v = tl.load(v_ptr + batch * svb + kvh * svh + (first + cols[:, None]) * svn + dims[None, :], mask=inside, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    group = H // HKV
    for h in range(kvh * group, kvh * group + group):
        q_head = q_ptr + batch * sqb + h * sqh + first * sqm
        do_head = do_ptr + batch * sdb + h * sdh + first * sdm
        lse_head = lse_ptr + batch * slb + h * slh + first
        delta_head = delta_ptr + batch * slb + h * slh + first
        if CAUSAL:  # queries before the block's first key see none of it; the diagonal blocks need the mask
            start = pid_n * BLOCK_N // BLOCK_M * BLOCK_M
            diagonal = tl.minimum(tl.cdiv((pid_n + 1) * BLOCK_N, BLOCK_M) * BLOCK_M, m_len)
            dk, dv = _dkdv_blocks(dk, dv, k, v, q_head, do_head, lse_head, delta_head, cols, dims, start, diagonal,
                                  m_len, D, sqm, sdm, qk_scale, BLOCK_M, True, STAGES, PRECISION)
        else:
            diagonal = 0
        dk, dv = _dkdv_blocks(dk, dv, k, v, q_head, do_head, lse_head, delta_head, cols, dims, diagonal, m_len,
                              m_len, D, sqm, sdm, qk_scale, BLOCK_M, False, STAGES, PRECISION)
    out = batch * sgb + kvh * sgh + (first + cols[:, None]) * sgn + dims[None, :]
    tl.store(dk_ptr + out, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=inside)
    tl.store(dv_ptr + out, dv.to(dv_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _dq_blocks(dq, q, do, lse, delta, k_head, v_head, rows, dims, start, stop, N, D, skn, svn, qk_scale,
               BLOCK_N: tl.constexpr, MASKED: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # One query block (q, do: BLOCK_M × BLOCK_D, lse in base 2, delta, on chip) against the key blocks
    # [start, stop): P recomputed, dS = P ∘ (dO Vᵀ − D), dQ += dS K (scale applied after the loop).
    ### BEGIN SOLUTION
    for begin in tl.range(start, stop, BLOCK_N, num_stages=STAGES):
        cols = begin + tl.arange(0, BLOCK_N)
        inside = (cols[:, None] < N) & (dims[None, :] < D)
        k = tl.load(k_head + cols[:, None] * skn + dims[None, :], mask=inside, other=0.0)
        v = tl.load(v_head + cols[:, None] * svn + dims[None, :], mask=inside, other=0.0)
        p = tl.exp2(tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale - lse[:, None])
        if MASKED:
            p = tl.where(cols[None, :] <= rows[:, None], p, 0.0)
        ds = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    ### END SOLUTION
    return dq


@triton.jit
def flash_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, cu_ptr, M, N, D, H, HKV, qk_scale,
                    sm_scale, sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdb, sdh, sdm, slb, slh, sgb, sgh, sgm,
                    N_BUCKET, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # Program (query block, b·H + h) keeps BLOCK_M queries, their dO, LSE and D on chip and streams the key
    # and value blocks of head kv_head_of(h) past them (causal: up to the diagonal); writes dQ once.
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    kvh = kv_head_of(h, H, HKV)
    batch, first, m_len = _sequence(cu_ptr, b, M, VARLEN)
    if VARLEN:
        n_len = m_len
    else:
        n_len = N + 0 * m_len
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    inside = (rows[:, None] < m_len) & (dims[None, :] < D)
    q = tl.load(q_ptr + batch * sqb + h * sqh + (first + rows[:, None]) * sqm + dims[None, :], mask=inside, other=0.0)
    do = tl.load(do_ptr + batch * sdb + h * sdh + (first + rows[:, None]) * sdm + dims[None, :], mask=inside,
                 other=0.0)
    lse = tl.load(lse_ptr + batch * slb + h * slh + first + rows, mask=rows < m_len, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_ptr + batch * slb + h * slh + first + rows, mask=rows < m_len, other=0.0)
    k_head = k_ptr + batch * skb + kvh * skh + first * skn
    v_head = v_ptr + batch * svb + kvh * svh + first * svn
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CAUSAL:
        free = tl.minimum(pid_m * BLOCK_M, n_len) // BLOCK_N * BLOCK_N
        stop = tl.minimum((pid_m + 1) * BLOCK_M, n_len)
    else:  # keys past N load as zeros and add nothing to dS K: no mask needed
        free = n_len
        stop = n_len
    dq = _dq_blocks(dq, q, do, lse, delta, k_head, v_head, rows, dims, 0, free, n_len, D, skn, svn, qk_scale,
                    BLOCK_N, False, STAGES, PRECISION)
    dq = _dq_blocks(dq, q, do, lse, delta, k_head, v_head, rows, dims, free, stop, n_len, D, skn, svn, qk_scale,
                    BLOCK_N, True, STAGES, PRECISION)
    tl.store(dq_ptr + batch * sgb + h * sgh + (first + rows[:, None]) * sgm + dims[None, :],
             (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=inside)


# ---------------------------------------------------------------- launch configurations
# (BLOCK_M, BLOCK_N, num_warps, num_stages). On a GPU each kernel is autotuned once per head dimension, mask,
# variant and power-of-two length over its candidates below; the Triton interpreter on CPU uses CPU_TILES.
CPU_TILES = (32, 32, 4, 1)
FORWARD_CONFIGS = [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 4)]
DKDV_CONFIGS = [(32, 128, 4, 3), (64, 128, 8, 3), (32, 128, 8, 4), (64, 64, 4, 3), (16, 128, 4, 4)]
DQ_CONFIGS = [(128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 8, 4), (64, 32, 4, 4)]
KEYS = ["N_BUCKET", "BLOCK_D", "CAUSAL", "HKV", "VARLEN"]


def _autotuned(kernel, configs, keys=()):
    if not ON_GPU:
        return None
    return triton.autotune([triton.Config({"BLOCK_M": m, "BLOCK_N": n, "STAGES": s}, num_warps=w, num_stages=s)
                            for m, n, w, s in configs], key=KEYS + list(keys))(kernel)


TUNED = {"forward": _autotuned(flash_forward_kernel, FORWARD_CONFIGS, ("SEQ_PARALLEL", "DEFER", "EXP2")),
         "dkdv": _autotuned(flash_dkdv_kernel, DKDV_CONFIGS), "dq": _autotuned(flash_dq_kernel, DQ_CONFIGS)}


def _launch(name: str, kernel, grid_of, args: tuple, tiles, **meta):
    """Launch `kernel` with fixed `tiles` (BLOCK_M, BLOCK_N, warps, stages), or on a GPU without them its
    autotuned twin; `grid_of(BLOCK_M, BLOCK_N)` sizes the grid."""
    if tiles is None and ON_GPU:
        TUNED[name][lambda cfg: grid_of(cfg["BLOCK_M"], cfg["BLOCK_N"])](*args, **meta)
        return
    block_m, block_n, warps, stages = tiles or CPU_TILES
    kernel[grid_of(block_m, block_n)](*args, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, num_warps=warps,
                                      num_stages=stages, **meta)


def _strides(t: torch.Tensor, varlen: bool):
    """(batch, head, row) strides: of a (B, H, N, d) tensor, or of a packed (T, H, d) one (no batch stride)."""
    return (0, t.stride(1), t.stride(0)) if varlen else t.stride()[:3]


def _lse_strides(lse: torch.Tensor, varlen: bool):
    """(batch, head) strides of a (B, H, M) LSE or D, or of a packed (H, T) one; rows are contiguous."""
    return (0, lse.stride(0)) if varlen else lse.stride()[:2]


def _common(q, k, m, n, causal, varlen, cu, fallback):
    """The arguments every launch shares: cu_seqlens (or any tensor when dense), lengths, d, heads, and the
    constexprs."""
    d = q.shape[-1]
    args = (cu if cu is not None else fallback, m, n, d, q.shape[1], k.shape[1])
    meta = {"BLOCK_D": max(16, triton.next_power_of_2(d)), "CAUSAL": bool(causal), "VARLEN": varlen,
            "PRECISION": "ieee" if q.dtype == torch.float32 else "tf32"}
    return args, meta


# ---------------------------------------------------------------- day 4 / day 5: the forward
def flash_forward(q, k, v, causal: bool = False, scale=None, *, seq_parallel: bool = True, defer_norm: bool = True,
                  exp2: bool = True, tiles=None):
    """FlashAttention-2's forward: (o, lse), o (B, H, M, d) in q's dtype, lse (B, H, M) float32 natural log.
    k and v may have fewer heads than q (grouped-query: Hkv dividing H). The keyword switches turn
    FlashAttention-2's improvements off one at a time (day 4): seq_parallel (a program per query block, not per
    head), defer_norm (divide by l once at the end), exp2 (base-2 logits with the scale folded in); tiles
    (BLOCK_M, BLOCK_N, warps, stages) fixes the launch instead of autotuning it."""
    q, k, v, scale = _heads("flash_forward", q, k, v, scale)
    (bsz, heads, m, d), n = q.shape, k.shape[2]
    o = torch.empty((bsz, heads, m, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((bsz, heads, m), dtype=torch.float32, device=q.device)
    _forward(q, k, v, o, lse, None, m, n, causal, scale, bsz, False, tiles, seq_parallel, defer_norm, exp2)
    return o, lse


def _forward(q, k, v, o, lse, cu, m, n, causal, scale, bsz, varlen, tiles, seq_parallel=True, defer_norm=True,
             exp2=True):
    common, meta = _common(q, k, m, n, causal, varlen, cu, lse)
    grid = lambda bm, bn: (triton.cdiv(m, bm) if seq_parallel else 1, bsz * q.shape[1])  # noqa: E731
    args = (q, k, v, o, lse, *common, scale * (LOG2E if exp2 else 1.0), *_strides(q, varlen), *_strides(k, varlen),
            *_strides(v, varlen), *_strides(o, varlen), *_lse_strides(lse, varlen), triton.next_power_of_2(max(m, n)))
    _launch("forward", flash_forward_kernel, grid, args, tiles, SEQ_PARALLEL=seq_parallel, DEFER=defer_norm,
            EXP2=exp2, **meta)


# ---------------------------------------------------------------- day 3: the backward
def attention_delta(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    """D = rowsum(dO ∘ O) of (B, H, M, d) tensors: (B, H, M) float32, the backward's preprocessing."""
    o, do = as_heads(o, "attention_delta", "o"), as_heads(do, "attention_delta", "do")
    if o.shape != do.shape:
        raise ValueError(f"attention_delta: o {tuple(o.shape)} and do {tuple(do.shape)} must have the same shape")
    bsz, heads, m, d = o.shape
    delta = torch.empty((bsz, heads, m), dtype=torch.float32, device=o.device)
    block_m = 64 if ON_GPU else 32
    attention_delta_kernel[(triton.cdiv(m, block_m), bsz * heads)](
        o, do, delta, m, d, heads, *o.stride()[:3], *do.stride()[:3], BLOCK_M=block_m,
        BLOCK_D=max(16, triton.next_power_of_2(d)))
    return delta


def _backward_args(q, k, v, do, lse, delta):
    if lse.dtype != torch.float32 or delta.dtype != torch.float32 or lse.shape != q.shape[:3] \
            or delta.shape != q.shape[:3]:
        raise ValueError(f"lse and delta must be float32 tensors of shape {tuple(q.shape[:3])}; got lse "
                         f"{lse.dtype} {tuple(lse.shape)}, delta {delta.dtype} {tuple(delta.shape)}")
    return lse.contiguous(), delta.contiguous()


def flash_dkdv(q, k, v, do, lse, delta, causal: bool = False, scale=None, tiles=None):
    """(dk, dv) of attention, one program per key block; lse and delta (B, H, M) float32 from the forward and
    attention_delta. Grouped-query k, v sum the gradients of their query heads."""
    q, k, v, scale = _heads("flash_dkdv", q, k, v, scale)
    do = as_heads(do, "flash_dkdv", "do")
    lse, delta = _backward_args(q, k, v, do, lse, delta)
    dk, dv = torch.empty(k.shape, dtype=k.dtype, device=k.device), torch.empty(v.shape, dtype=v.dtype, device=v.device)
    _dkdv(q, k, v, do, lse, delta, dk, dv, None, q.shape[2], k.shape[2], causal, scale, q.shape[0], False, tiles)
    return dk, dv


def _dkdv(q, k, v, do, lse, delta, dk, dv, cu, m, n, causal, scale, bsz, varlen, tiles):
    common, meta = _common(q, k, m, n, causal, varlen, cu, lse)
    grid = lambda bm, bn: (triton.cdiv(n, bn), bsz * k.shape[1])  # noqa: E731
    args = (q, k, v, do, lse, delta, dk, dv, *common, scale * LOG2E, scale, *_strides(q, varlen), *_strides(k, varlen),
            *_strides(v, varlen), *_strides(do, varlen), *_lse_strides(lse, varlen), *_strides(dk, varlen),
            triton.next_power_of_2(max(m, n)))
    _launch("dkdv", flash_dkdv_kernel, grid, args, tiles, **meta)


def flash_dq(q, k, v, do, lse, delta, causal: bool = False, scale=None, tiles=None):
    """dq of attention, one program per query block; lse and delta as for flash_dkdv."""
    q, k, v, scale = _heads("flash_dq", q, k, v, scale)
    do = as_heads(do, "flash_dq", "do")
    lse, delta = _backward_args(q, k, v, do, lse, delta)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _dq(q, k, v, do, lse, delta, dq, None, q.shape[2], k.shape[2], causal, scale, q.shape[0], False, tiles)
    return dq


def _dq(q, k, v, do, lse, delta, dq, cu, m, n, causal, scale, bsz, varlen, tiles):
    common, meta = _common(q, k, m, n, causal, varlen, cu, lse)
    grid = lambda bm, bn: (triton.cdiv(m, bm), bsz * q.shape[1])  # noqa: E731
    args = (q, k, v, do, lse, delta, dq, *common, scale * LOG2E, scale, *_strides(q, varlen), *_strides(k, varlen),
            *_strides(v, varlen), *_strides(do, varlen), *_lse_strides(lse, varlen), *_strides(dq, varlen),
            triton.next_power_of_2(max(m, n)))
    _launch("dq", flash_dq_kernel, grid, args, tiles, **meta)


def flash_backward(q, k, v, o, do, lse, causal: bool = False, scale=None):
    """(dq, dk, dv): the preprocessing kernel, then the dK/dV and dQ kernels."""
    delta = attention_delta(o, do)
    dk, dv = flash_dkdv(q, k, v, do, lse, delta, causal, scale)
    return flash_dq(q, k, v, do, lse, delta, causal, scale), dk, dv


class FlashAttention(torch.autograd.Function):
    """softmax(scale · q kᵀ) v with FlashAttention-2's forward and backward; saves q, k, v, o and the LSE."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        o, lse = flash_forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(q, k, v, o, do.contiguous(), lse, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None


def flash_attn(q, k, v, causal: bool = False, scale=None):
    """Differentiable FlashAttention on (B, H, M, d) queries and (B, Hkv, N, d) keys and values."""
    return FlashAttention.apply(q, k, v, causal, scale)


# ---------------------------------------------------------------- day 5: packed variable-length batches
def _packed(op, q, k, v, cu_seqlens, scale):
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] \
            or q.shape[1] % k.shape[1]:
        raise ValueError(f"{op}: q (tokens, H, d), k and v (tokens, Hkv, d) with Hkv dividing H; got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    cu = torch.as_tensor(cu_seqlens, device=q.device).to(torch.int32)
    if cu.dim() != 1 or cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != q.shape[0] or (cu[1:] < cu[:-1]).any():
        raise ValueError(f"{op}: cu_seqlens must rise from 0 to the number of tokens ({q.shape[0]}); got "
                         f"{cu.tolist()}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return q, k, v, cu, int((cu[1:] - cu[:-1]).max()), 1 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def varlen_forward(q, k, v, cu_seqlens, causal: bool = False, scale=None):
    """(o, lse) of a packed batch: q (T, H, d), k and v (T, Hkv, d), sequence i in rows cu_seqlens[i] ..
    cu_seqlens[i+1]; o (T, H, d), lse (H, T). No padding is computed."""
    q, k, v, cu, longest, scale = _packed("varlen_forward", q, k, v, cu_seqlens, scale)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    _forward(q, k, v, o, lse, cu, longest, longest, causal, scale, cu.numel() - 1, True, None)
    return o, lse


def varlen_backward(q, k, v, o, do, lse, cu_seqlens, causal: bool = False, scale=None):
    """(dq, dk, dv) of varlen_forward, packed like the inputs."""
    q, k, v, cu, longest, scale = _packed("varlen_backward", q, k, v, cu_seqlens, scale)
    as_bhnd = lambda t: t.unsqueeze(0).transpose(1, 2)  # noqa: E731  (T, H, d) seen as (1, H, T, d)
    delta = attention_delta(as_bhnd(o), as_bhnd(do.contiguous()))[0]
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    batch = cu.numel() - 1
    _dkdv(q, k, v, do, lse, delta, dk, dv, cu, longest, longest, causal, scale, batch, True, None)
    _dq(q, k, v, do, lse, delta, dq, cu, longest, longest, causal, scale, batch, True, None)
    return dq, dk, dv


class FlashAttentionVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, causal, scale):
        o, lse = varlen_forward(q, k, v, cu_seqlens, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse, torch.as_tensor(cu_seqlens, device=q.device))
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, cu = ctx.saved_tensors
        return (*varlen_backward(q, k, v, o, do.contiguous(), lse, cu, ctx.causal, ctx.scale), None, None, None)


def flash_attn_varlen(q, k, v, cu_seqlens, causal: bool = False, scale=None):
    """Differentiable attention over a packed variable-length batch (see varlen_forward)."""
    return FlashAttentionVarlen.apply(q, k, v, cu_seqlens, causal, scale)


# ---------------------------------------------------------------- day 5: split-K decoding
@triton.jit
def flash_decode_kernel(q_ptr, k_ptr, v_ptr, len_ptr, o_part_ptr, lse_part_ptr, MQ, D, H, HKV, qk_scale, chunk,
                        sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # Program (split, b·Hkv + kvh): the G·MQ query rows of the heads that share kv head kvh (row r is token
    # r % MQ of head kvh·G + r // MQ), against keys [split·chunk, (split+1)·chunk) of the cache's first len[b].
    # Writes its partial (o normalised by its own sum, natural-log lse) in float32, for merge_splits_kernel.
    split, bkv = tl.program_id(0), tl.program_id(1)
    b, kvh = bkv // HKV, bkv % HKV
    group = H // HKV
    r = tl.arange(0, BLOCK_M)
    h, token = kvh * group + r // MQ, r % MQ
    live = r < group * MQ
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + b.to(tl.int64) * sqb + h[:, None] * sqh + token[:, None] * sqm + dims[None, :],
                mask=live[:, None] & (dims[None, :] < D), other=0.0)
    n = tl.load(len_ptr + b)
    start = split * chunk
    stop = tl.minimum(start + chunk, n)
    k_head = k_ptr + b.to(tl.int64) * skb + kvh * skh
    v_head = v_ptr + b.to(tl.int64) * svb + kvh * svh
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    acc, m_i, l_i = _forward_blocks(acc, m_i, l_i, q, k_head, v_head, r, dims, start, stop, stop, D, skn, svn,
                                    qk_scale, BLOCK_N, True, False, True, True, STAGES, PRECISION)
    rows = (split * tl.num_programs(1) * group + b * H + h) * MQ + token  # part (split, b, h, token)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    tl.store(o_part_ptr + rows[:, None].to(tl.int64) * D + dims[None, :], acc / l_safe[:, None],
             mask=live[:, None] & (dims[None, :] < D))
    tl.store(lse_part_ptr + rows, tl.where(l_i > 0, (m_i + tl.log2(l_safe)) / 1.4426950408889634, -float("inf")),
             mask=live)


@triton.jit
def merge_splits_kernel(o_part_ptr, lse_part_ptr, o_ptr, lse_ptr, S, R, D, BLOCK_S: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    # Program r merges the S partial states of output row r (merge_splits, day 5) and writes o and lse.
    r = tl.program_id(0)
    parts = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    lse = tl.load(lse_part_ptr + parts * R + r, mask=parts < S, other=-float("inf"))
    top = tl.max(lse, axis=0)
    shift = tl.where(top == -float("inf"), 0.0, top)
    weights = tl.exp(lse - shift)
    total = tl.sum(weights, axis=0)
    o = tl.load(o_part_ptr + (parts[:, None] * R + r).to(tl.int64) * D + dims[None, :],
                mask=(parts[:, None] < S) & (dims[None, :] < D), other=0.0)
    o = tl.sum(weights[:, None] * o, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(o_ptr + r.to(tl.int64) * D + dims, o.to(o_ptr.dtype.element_ty), mask=dims < D)
    tl.store(lse_ptr + r, tl.where(total > 0, shift + tl.log(tl.where(total > 0, total, 1.0)), -float("inf")))


def decode_splits(batch: int, kv_heads: int, n: int, block_n: int) -> int:
    """How many programs share one head's cache: enough (batch · Hkv · splits) to give every SM about two,
    never a split shorter than one block."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count if ON_GPU else 4
    return max(1, min(triton.cdiv(n, block_n), triton.cdiv(2 * sms, batch * kv_heads), 256))


def flash_decode(q, k_cache, v_cache, cache_lengths=None, splits=None, scale=None):
    """Decoding: a few query tokens q (B, H, Mq, d) against a KV cache (B, Hkv, Nmax, d) of which batch entry b
    holds cache_lengths[b] valid keys (default: all). Each (b, kv head)'s cache is split across `splits`
    programs (default: decode_splits; 1 = the non-split kernel), their partial states merged. Returns (o, lse).
    The query tokens see every valid key (no causal mask)."""
    q, k, v, scale = _heads("flash_decode", q, k_cache, v_cache, scale)
    (bsz, heads, mq, d), (kv_heads, n) = q.shape, k.shape[1:3]
    lengths = torch.full((bsz,), n, dtype=torch.int32, device=q.device) if cache_lengths is None else \
        torch.as_tensor(cache_lengths, device=q.device).to(torch.int32).reshape(bsz)
    block_m = max(16, triton.next_power_of_2(heads // kv_heads * mq))
    block_n = 64 if ON_GPU else 32
    splits = splits or decode_splits(bsz, kv_heads, n, block_n)
    chunk = triton.cdiv(triton.cdiv(n, splits), block_n) * block_n
    o_part = torch.empty((splits, bsz, heads, mq, d), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((splits, bsz, heads, mq), dtype=torch.float32, device=q.device)
    flash_decode_kernel[(splits, bsz * kv_heads)](
        q, k, v, lengths, o_part, lse_part, mq, d, heads, kv_heads, scale * LOG2E, chunk, *q.stride()[:3],
        *k.stride()[:3], *v.stride()[:3], BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
        STAGES=3 if ON_GPU else 1, PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4)
    o = torch.empty((bsz, heads, mq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((bsz, heads, mq), dtype=torch.float32, device=q.device)
    merge_splits_kernel[(bsz * heads * mq,)](o_part, lse_part, o, lse, splits, bsz * heads * mq, d,
                                             BLOCK_S=max(2, triton.next_power_of_2(splits)),
                                             BLOCK_D=max(16, triton.next_power_of_2(d)))
    return o, lse
