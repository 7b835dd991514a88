"""Your exercises. Generated from solutions/w38_flash_attention_impl.py by `python -m course stubs`.

Replace every `YOUR CODE HERE` line with your code, then run the grading cell in the notebook
(or `python -m course grade w38.<exercise>`). The reference solutions are in solutions/w38_flash_attention_impl.py:
try first, peek later.
"""
import functools
import math

import numpy as np
import torch
import triton
import triton.language as tl

from course.backend import ON_GPU
from course.cuda import CudaKernel
from course.heads import as_heads, on_device

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e); a constexpr, so kernels read it (the host: LOG2E.value)


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
    # YOUR CODE HERE
    return dq, dk, dv


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
    # YOUR CODE HERE
    tl.store(delta_ptr + bh.to(tl.int64) * M + rows, delta, mask=rows < M)


@triton.jit
def _dkdv_blocks(dk, dv, k, v, q_head, do_head, lse_head, delta_head, cols, dims, start, stop, M, D, sqm, sdm,
                 qk_scale, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, STAGES: tl.constexpr,
                 PRECISION: tl.constexpr):
    # One key block (k, v: BLOCK_N × BLOCK_D, on chip) against the query blocks [start, stop) of one query
    # head: Pᵀ recomputed from the saved log-sum-exp, dV += Pᵀ dO, dSᵀ = Pᵀ ∘ (dPᵀ − D), dK += dSᵀ Q (the
    # softmax scale is applied once, after the loop). MASKED: the blocks on the causal diagonal.
    # YOUR CODE HERE
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
               BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, STAGES: tl.constexpr,
               PRECISION: tl.constexpr):
    # One query block (q, do: BLOCK_M × BLOCK_D, lse in base 2, delta, on chip) against the key blocks
    # [start, stop): P recomputed, dS = P ∘ (dO Vᵀ − D), dQ += dS K (scale applied after the loop).
    # MASKED: the blocks may hold keys past N (their P must be 0: exp2(0 − lse) of a zero key is not) or
    # (CAUSAL) keys after a query.
    # YOUR CODE HERE
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
    lse = tl.load(lse_ptr + batch * slb + h * slh + first + rows, mask=rows < m_len, other=0.0) * LOG2E
    delta = tl.load(delta_ptr + batch * slb + h * slh + first + rows, mask=rows < m_len, other=0.0)
    k_head = k_ptr + batch * skb + kvh * skh + first * skn
    v_head = v_ptr + batch * svb + kvh * svh + first * svn
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CAUSAL:
        free = tl.minimum(pid_m * BLOCK_M, n_len) // BLOCK_N * BLOCK_N
        stop = tl.minimum((pid_m + 1) * BLOCK_M, n_len)
    else:
        free = n_len // BLOCK_N * BLOCK_N
        stop = n_len
    dq = _dq_blocks(dq, q, do, lse, delta, k_head, v_head, rows, dims, 0, free, n_len, D, skn, svn, qk_scale,
                    BLOCK_N, False, CAUSAL, STAGES, PRECISION)
    dq = _dq_blocks(dq, q, do, lse, delta, k_head, v_head, rows, dims, free, stop, n_len, D, skn, svn, qk_scale,
                    BLOCK_N, True, CAUSAL, STAGES, PRECISION)
    tl.store(dq_ptr + batch * sgb + h * sgh + (first + rows[:, None]) * sgm + dims[None, :],
             (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=inside)


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
    args = (q, k, v, do, lse, delta, dk, dv, *common, scale * LOG2E.value, scale, *_strides(q, varlen),
            *_strides(k, varlen), *_strides(v, varlen), *_strides(do, varlen), *_lse_strides(lse, varlen),
            *_strides(dk, varlen), triton.next_power_of_2(max(m, n)))
    _launch("dkdv", flash_dkdv_kernel, grid, args, tiles, max(m, n), **meta)


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
    args = (q, k, v, do, lse, delta, dq, *common, scale * LOG2E.value, scale, *_strides(q, varlen),
            *_strides(k, varlen), *_strides(v, varlen), *_strides(do, varlen), *_lse_strides(lse, varlen),
            *_strides(dq, varlen), triton.next_power_of_2(max(m, n)))
    _launch("dq", flash_dq_kernel, grid, args, tiles, max(m, n), **meta)


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
            lse = tl.where(l_i > 0, (m_i + tl.log2(l_safe)) / LOG2E, -float("inf"))
        else:
            lse = tl.where(l_i > 0, m_i + tl.log(l_safe), -float("inf"))
        tl.store(o_head + rows[:, None] * som + dims[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=(rows[:, None] < m_len) & (dims[None, :] < D))
        tl.store(lse_head + rows, lse, mask=rows < m_len)


# ---------------------------------------------------------------- launch configurations
# (BLOCK_M, BLOCK_N, num_warps, num_stages). On a GPU a kernel is autotuned over its candidates below, once per
# head dimension, mask, variant and power-of-two length, from TUNE_FROM tokens on (below, the first candidate:
# small problems take milliseconds and would pay seconds of tuning); the Triton interpreter on CPU uses CPU_TILES.
CPU_TILES = (32, 32, 4, 1)
TUNE_FROM = 1024
FORWARD_CONFIGS = [(64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3)]
DKDV_CONFIGS = [(32, 64, 4, 3), (32, 128, 4, 3), (64, 128, 8, 3)]
DQ_CONFIGS = [(64, 32, 4, 3), (128, 32, 4, 3), (128, 64, 8, 3)]
KEYS = ["N_BUCKET", "BLOCK_D", "CAUSAL", "HKV", "VARLEN"]


def _autotuned(kernel, configs, keys=()):
    if not ON_GPU:
        return None
    return triton.autotune([triton.Config({"BLOCK_M": m, "BLOCK_N": n, "STAGES": s}, num_warps=w, num_stages=s)
                            for m, n, w, s in configs], key=KEYS + list(keys))(kernel)


TUNED = {"forward": _autotuned(flash_forward_kernel, FORWARD_CONFIGS, ("SEQ_PARALLEL", "DEFER", "EXP2")),
         "dkdv": _autotuned(flash_dkdv_kernel, DKDV_CONFIGS), "dq": _autotuned(flash_dq_kernel, DQ_CONFIGS)}
FIRST = {"forward": FORWARD_CONFIGS[0], "dkdv": DKDV_CONFIGS[0], "dq": DQ_CONFIGS[0]}


def _launch(name: str, kernel, grid_of, args: tuple, tiles, size: int, **meta):
    """Launch `kernel` with fixed `tiles` (BLOCK_M, BLOCK_N, warps, stages), or on a GPU without them its
    autotuned twin (from TUNE_FROM tokens on); `grid_of(BLOCK_M, BLOCK_N)` sizes the grid."""
    if tiles is None and ON_GPU:
        if size >= TUNE_FROM:
            TUNED[name][lambda cfg: grid_of(cfg["BLOCK_M"], cfg["BLOCK_N"])](*args, **meta)
            return
        tiles = FIRST[name]
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
    args = (q, k, v, o, lse, *common, scale * (LOG2E.value if exp2 else 1.0), *_strides(q, varlen),
            *_strides(k, varlen), *_strides(v, varlen), *_strides(o, varlen), *_lse_strides(lse, varlen),
            triton.next_power_of_2(max(m, n)))
    _launch("forward", flash_forward_kernel, grid, args, tiles, max(m, n), SEQ_PARALLEL=seq_parallel, DEFER=defer_norm,
            EXP2=exp2, **meta)


# ---------------------------------------------------------------- day 4: the tensor-core forward (CuPy RawKernel)
# the launch below and the constants in the source must agree
TC_BR, TC_BC, TC_THREADS, TC_STAGES, TC_PAD, TC_MAX_D = 64, 64, 128, 2, 8, 128

TC_FLASH_ATTENTION_SRC = r"""
// FlashAttention forward on the tensor cores, FlashAttention-2's schedule: storage T half or bf16, products in
// T, sums in float32. One block of 128 threads (4 warps) per (query block of BR = 64 rows, head z = b·H + h).
// Warp w owns query rows w*16 .. w*16+15 of the block: their Q fragments (in registers), their 16 × 64 scores of
// each key tile, their running max and sum and their 16 × DH output accumulator, all in mma.m16n8k16 fragments.
// The key and value tiles of BC = 64 keys stream through shared memory in two stages: cp.async fetches tile
// j+1 while the tensor cores work on tile j. Reads Q once and K, V once per query block (causal: only up to the
// diagonal); writes O (contiguous (B, H, M, D) in T) and the natural-log LSE of every query row (float32,
// (B·H, M)). Head dims with D % 16 == 0 and D <= 128 run as DH = 64 or 128 columns, the rest zero-filled.
//
// Fragments: lane = 4g + t. An accumulator c[4] (16 × 8, float) holds row g at columns 2t, 2t+1 (c[0], c[1])
// and row g+8 at the same columns (c[2], c[3]). An A operand a[4] (16 × 16, pairs of T) holds those same
// places of its left and right 8 columns: a[0] row g, a[1] row g+8, a[2] row g (+8 columns), a[3] row g+8 (+8).
// A B operand b0, b1 (16 × 8) holds rows 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1) of column g.
constexpr int BR = 64, BC = 64, THREADS = 128, STAGES = 2, PAD = 8;
constexpr float LN2 = 0.6931471805599453f;

template <typename T> struct is_bf16 { static constexpr bool value = false; };
template <> struct is_bf16<bf16_t> { static constexpr bool value = true; };

// The 32-bit shared-state-space address of a generic pointer into shared memory (what ldmatrix, cp.async take).
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// cp.async: 16 bytes from global to shared memory, skipping L1 (.cg); src_bytes = 0 writes 16 zero bytes.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// Close this thread's copies issued so far into one group; wait until every group of this thread has landed
// (the other threads see the data only after a __syncthreads() that follows the wait).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// ldmatrix ×4: lanes 8i .. 8i+7 give the addresses of the 8 rows (16 bytes each) of 8 × 8 matrix i; lane 4g + t
// receives in r[i] elements (g, 2t), (g, 2t+1) of matrix i, or with .trans (2t, g), (2t+1, g).
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

// d += a · b for one warp on the tensor cores: a 16 × 16 and b 16 × 8 in T, d 16 × 8 in float.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    if constexpr (is_bf16<T>::value)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]),
              "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]),
              "r"(b0), "r"(b1));
}

// Two floats rounded to T and packed in one register, lo in the low half (the lower column of a fragment pair).
template <typename T>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    unsigned r;
    if constexpr (is_bf16<T>::value) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// 2^x on the special-function unit (2^-inf = 0).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Rows [first, first + ROWS) of an (n, D) matrix at row stride `stride` (rows 16-byte aligned) into shared
// memory at row stride DH + PAD, by cp.async in 16-byte pieces; rows past n and columns past D become zeros.
template <typename T, int DH, int ROWS>
__device__ __forceinline__ void load_tile_async(T* dst, const T* src, int first, int n, int D, int stride) {
    constexpr int PIECES = DH / 8;  // 16-byte pieces per row
    #pragma unroll
    for (int it = 0; it < ROWS * PIECES / THREADS; ++it) {
        const int i = threadIdx.x + it * THREADS, r = i / PIECES, c = (i % PIECES) * 8;
        const bool inside = first + r < n && c < D;
        const T* from = inside ? src + (size_t)(first + r) * stride + c : src;  // a valid address either way
        cp_async16(smem_u32(dst + r * (DH + PAD) + c), from, inside ? 16 : 0);
    }
}

template <typename T, int DH>
__device__ __forceinline__ void tc_attend(const T* q, const T* k, const T* v, T* o, float* lse, int M, int N,
                                          int D, int H, float qk_scale, int causal, int sqb, int sqh, int sqm,
                                          int skb, int skh, int skn, int svb, int svh, int svn, T* smem) {
    // Shared memory: Q's tile, then K's two stages, then V's two stages, each 64 rows of DH + PAD elements.
    // The 16 padding bytes move each row 4 banks along, so the 8 row addresses of one ldmatrix matrix fall on
    // 8 different groups of 4 banks: no conflicts, for loads (ldmatrix) and stores (cp.async) alike.
    constexpr int DP = DH + PAD, TILE = BC * DP;
    T* Qs = smem;
    T* Ks = Qs + BR * DP;
    T* Vs = Ks + STAGES * TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int qb = causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // causal: the longest rows start first
    const int first = qb * BR, z = blockIdx.y, b = z / H, h = z % H;
    const T* Q = q + (size_t)b * sqb + (size_t)h * sqh;
    const T* K = k + (size_t)b * skb + (size_t)h * skh;
    const T* V = v + (size_t)b * svb + (size_t)h * svh;
    const int stop = causal ? min(first + BR, N) : N;  // causal: no key after the block's last query
    const int tiles = (stop + BC - 1) / BC;

    load_tile_async<T, DH, BR>(Qs, Q, first, M, D, sqm);
    load_tile_async<T, DH, BC>(Ks, K, 0, N, D, skn);
    load_tile_async<T, DH, BC>(Vs, V, 0, N, D, svn);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    // The warp's 16 query rows as A operands: qf[kk] holds head-dim columns 16kk .. 16kk+15. Lane 8i + r gives
    // row r of matrix i: matrices (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, 8-15), (rows 8-15, 8-15).
    unsigned qf[DH / 16][4];
    {
        const T* row = Qs + (warp * 16 + lane % 8 + 8 * (lane / 8 % 2)) * DP + 8 * (lane / 16);
        #pragma unroll
        for (int kk = 0; kk < DH / 16; ++kk) ldsm_x4(qf[kk], smem_u32(row + 16 * kk));
    }
    // Per row g, g+8 of the warp: running max of the base-2 logits, this lane's share of the running sum.
    float m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f};
    float acc[DH / 8][4];  // O: acc[n] is the 16 × 8 accumulator of head-dim columns 8n .. 8n+7
    #pragma unroll
    for (int n = 0; n < DH / 8; ++n)
        #pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;

    for (int j = 0; j < tiles; ++j) {
        const int stage = j % STAGES, start = j * BC;
        cp_async_wait_all();  // this thread's pieces of tile j have landed ...
        __syncthreads();      // ... everyone's; and every warp is done with tile j - 1, whose stage is now free
        if (j + 1 < tiles) {  // fetch tile j + 1 while this one is computed
            load_tile_async<T, DH, BC>(Ks + (stage ^ 1) * TILE, K, start + BC, N, D, skn);
            load_tile_async<T, DH, BC>(Vs + (stage ^ 1) * TILE, V, start + BC, N, D, svn);
        }
        cp_async_commit();
        const T* Kt = Ks + stage * TILE;  // keys start .. start + 63, one per row
        const T* Vt = Vs + stage * TILE;
        // the tail past N and (causal) the diagonal tile need a mask; the tiles below the diagonal do not
        const bool masked = start + BC > N || (causal && start + BC - 1 > first);
        // YOUR CODE HERE
    }
    cp_async_wait_all();  // nothing is in flight at exit (the last group is empty)
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
        float l = l_i[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);  // the row's sum over its 4 lanes
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = first + warp * 16 + g + 8 * r;
        if (row >= M) continue;
        const float inv = l > 0.f ? 1.f / l : 0.f;  // a row with no key at all writes zeros
        T* out = o + ((size_t)z * M + row) * D;
        #pragma unroll
        for (int n = 0; n < DH / 8; ++n) {
            const int col = 8 * n + 2 * t;
            if (col < D)
                *reinterpret_cast<unsigned*>(out + col) = pack2<T>(acc[n][2 * r] * inv, acc[n][2 * r + 1] * inv);
        }
        if (t == 0) lse[(size_t)z * M + row] = l > 0.f ? (m_i[r] + log2f(l)) * LN2 : -INFINITY;
    }
}

template <typename T>
__global__ void __launch_bounds__(THREADS) tc_flash_attention(
        const T* q, const T* k, const T* v, T* o, float* lse, int M, int N, int D, int H, float qk_scale,
        int causal, int sqb, int sqh, int sqm, int skb, int skh, int skn, int svb, int svh, int svn) {
    extern __shared__ float4 shared4[];  // (BR + 2 · STAGES · BC) rows of DH + PAD elements
    T* smem = reinterpret_cast<T*>(shared4);
    if (D > 64)
        tc_attend<T, 128>(q, k, v, o, lse, M, N, D, H, qk_scale, causal, sqb, sqh, sqm, skb, skh, skn, svb, svh,
                          svn, smem);
    else
        tc_attend<T, 64>(q, k, v, o, lse, M, N, D, H, qk_scale, causal, sqb, sqh, sqm, skb, skh, skn, svb, svh,
                         svn, smem);
}
"""
tc_flash_attention_kernel = CudaKernel(TC_FLASH_ATTENTION_SRC, "tc_flash_attention")


def _tc_ready(t: torch.Tensor) -> torch.Tensor:
    """t, or a contiguous copy when cp.async's 16-byte pieces would not be aligned (base or a stride)."""
    if t.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in t.stride()[:3]):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def tc_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale=None):
    """The tensor-core forward: (o, lse) like cuda_flash_attention for float16 or bfloat16 q, k, v (products in
    the storage type, sums in float32), head_dim a multiple of 16 up to 128."""
    op = "tc_flash_attention"
    q, k, v = (as_heads(t, op, name) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    (bsz, heads, m, d), n = q.shape, k.shape[2]
    if k.shape != (bsz, heads, n, d) or v.shape != k.shape or not q.dtype == k.dtype == v.dtype \
            or not q.device == k.device == v.device:
        raise ValueError(f"{op}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} must share batch, "
                         f"heads, head_dim, dtype and device; k and v must have the same shape")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"{op}: dtype {str(q.dtype).removeprefix('torch.')} is not supported; the tensor-core "
                         f"kernel takes float16 or bfloat16")
    if d > TC_MAX_D or d % 16:
        raise ValueError(f"{op}: head_dim {d} must be a multiple of 16 and at most {TC_MAX_D}")
    scale = 1 / math.sqrt(d) if scale is None else float(scale)
    q, k, v = _tc_ready(q), _tc_ready(k), _tc_ready(v)
    o = torch.empty((bsz, heads, m, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((bsz, heads, m), dtype=torch.float32, device=q.device)
    row_bytes = 2 * ((64 if d <= 64 else 128) + TC_PAD)  # DH + PAD elements of 2 bytes, as in the source
    shared = row_bytes * (TC_BR + 2 * TC_STAGES * TC_BC)
    tc_flash_attention_kernel((-(-m // TC_BR), bsz * heads), (TC_THREADS,), q, k, v, o, lse, m, n, d, heads,
                              scale * LOG2E.value, int(bool(causal)), *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                              shared_bytes=shared)
    return o, lse


# ---------------------------------------------------------------- day 5: merging split-K states, in NumPy
def merge_splits(o_parts, lse_parts):
    """S partial attention results over disjoint key ranges, o_parts (S, ..., d) (each normalised by its own
    sum) and lse_parts (S, ...) (the natural log of each one's sum of exponentials), merged into the result
    over all the keys: (o, lse). A part that saw no key has lse = -inf and counts for nothing; a row that no
    part saw gets o = 0 and lse = -inf."""
    # YOUR CODE HERE
    return o, lse


# ---------------------------------------------------------------- day 5: grouped-query heads
@triton.jit
def kv_head_of(h, H, HKV):
    # The key/value head that query head h reads when H query heads share HKV key/value heads (GQA; MQA when
    # HKV = 1): groups of G = H / HKV consecutive query heads share one.
    # YOUR CODE HERE
    return kvh


# ---------------------------------------------------------------- day 5: packed variable-length batches
def _packed(op, q, k, v, cu_seqlens, scale):
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] \
            or q.shape[1] % k.shape[1]:
        raise ValueError(f"{op}: q (tokens, H, d), k and v (tokens, Hkv, d) with Hkv dividing H; got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        on_device(t, op, name)
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
def flash_decode_kernel(q_ptr, k_ptr, v_ptr, len_ptr, o_part_ptr, lse_part_ptr, MQ, N, D, H, HKV, qk_scale, chunk,
                        sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr, LENGTHS: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # Program (split, b·Hkv + kvh): the G·MQ query rows of the heads that share kv head kvh (row r is token
    # r % MQ of head kvh·G + r // MQ), against keys [split·chunk, (split+1)·chunk) of the cache's first len[b]
    # (LENGTHS) or of all N.
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
    if LENGTHS:
        n = tl.load(len_ptr + b)
    else:
        n = N + 0 * b
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
    tl.store(lse_part_ptr + rows, tl.where(l_i > 0, (m_i + tl.log2(l_safe)) / LOG2E, -float("inf")),
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


@functools.lru_cache(maxsize=None)
def _sm_count() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count if ON_GPU else 4


def decode_splits(batch: int, kv_heads: int, n: int, block_n: int) -> int:
    """How many programs share one head's cache: enough (batch · Hkv · splits) to give every SM about two,
    never a split shorter than one block."""
    return max(1, min(triton.cdiv(n, block_n), triton.cdiv(2 * _sm_count(), batch * kv_heads), 256))


def flash_decode(q, k_cache, v_cache, cache_lengths=None, splits=None, scale=None):
    """Decoding: a few query tokens q (B, H, Mq, d) against a KV cache (B, Hkv, Nmax, d) of which batch entry b
    holds cache_lengths[b] valid keys (default: all). Each (b, kv head)'s cache is split across `splits`
    programs (default: decode_splits; 1 = the non-split kernel), their partial states merged. Returns (o, lse).
    The query tokens see every valid key (no causal mask)."""
    q, k, v, scale = _heads("flash_decode", q, k_cache, v_cache, scale)
    (bsz, heads, mq, d), (kv_heads, n) = q.shape, k.shape[1:3]
    lengths = None if cache_lengths is None else torch.as_tensor(cache_lengths, device=q.device).to(torch.int32)
    if lengths is not None and (lengths.numel() != bsz or (lengths < 0).any() or (lengths > n).any()):
        raise ValueError(f"flash_decode: cache_lengths must hold {bsz} lengths between 0 and {n}")
    block_m = max(16, triton.next_power_of_2(heads // kv_heads * mq))
    block_n = 64 if ON_GPU else 32
    splits = splits or decode_splits(bsz, kv_heads, n, block_n)
    chunk = triton.cdiv(triton.cdiv(n, splits), block_n) * block_n
    o_part = torch.empty((splits, bsz, heads, mq, d), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((splits, bsz, heads, mq), dtype=torch.float32, device=q.device)
    flash_decode_kernel[(splits, bsz * kv_heads)](
        q, k, v, q if lengths is None else lengths, o_part, lse_part, mq, n, d, heads, kv_heads, scale * LOG2E.value,
        chunk, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(d)), LENGTHS=lengths is not None, STAGES=3 if ON_GPU else 1, PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4)
    o = torch.empty((bsz, heads, mq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((bsz, heads, mq), dtype=torch.float32, device=q.device)
    merge_splits_kernel[(bsz * heads * mq,)](o_part, lse_part, o, lse, splits, bsz * heads * mq, d,
                                             BLOCK_S=max(2, triton.next_power_of_2(splits)),
                                             BLOCK_D=max(16, triton.next_power_of_2(d)))
    return o, lse
