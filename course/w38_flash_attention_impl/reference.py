"""Float64 NumPy references for week 38: the backward pass of attention, FlashAttention-2's tiled backward with
its HBM traffic counted, the split-K merge of (o, lse) states, grouped-query head mapping and packed
variable-length batches. Masks follow weeks 35-37 (causal aligned top-left: query i sees keys j <= i).

The backward of o = P v, P = softmax(S), S = scale · q kᵀ, for an upstream gradient dO (Dao, 2023,
"FlashAttention-2", Algorithm 2):
    dV = Pᵀ dO,  dP = dO Vᵀ,  D = rowsum(dO ∘ O),  dS = P ∘ (dP − D),  dQ = scale · dS K,  dK = scale · dSᵀ Q,
with P recomputed tile by tile from the forward's log-sum-exp: P = exp(S − lse).
"""
import math

import numpy as np

from ..w33_softmax.reference import merge_states as merge_softmax_states  # noqa: F401 (week 33's (m, l) merge)
from ..w35_attention_blocks.reference import attention_scores, log_sum_exp, masked_scores, softmax_rows


def _t(x):
    return np.swapaxes(x, -1, -2)


def expand_kv(kv, heads: int):
    """(B, Hkv, N, d) keys or values seen by (B, heads, ...) queries: query head h reads kv head h // (heads / Hkv).
    A copy, fine for a reference; the kernels index the shared head instead."""
    groups = heads // kv.shape[1]
    return np.repeat(kv, groups, axis=1)


def kv_head(h: int, heads: int, kv_heads: int) -> int:
    """The key/value head that query head h reads under grouped-query attention (multi-query: kv_heads = 1)."""
    return h // (heads // kv_heads)


def probabilities(q, k, causal=False, scale=None):
    return softmax_rows(masked_scores(attention_scores(q, k, scale), causal=causal))


def attention_forward(q, k, v, causal=False, scale=None):
    """(o, lse) with grouped-query heads allowed (k, v may have fewer heads than q)."""
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    return probabilities(q, k, causal, scale) @ v, log_sum_exp(q, k, causal, scale)


def delta(o, do):
    """D = rowsum(dO ∘ O), (B, H, M): equal to rowsum(P ∘ dP), the term dS subtracts."""
    return (o * do).sum(axis=-1)


def attention_backward(q, k, v, do, causal=False, scale=None):
    """(dq, dk, dv) of attention in float64. k and v may have fewer heads than q (grouped-query): the gradients
    of the query heads that share a key/value head are summed into it."""
    b, heads, m, d = q.shape
    kv_heads = k.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    ke, ve = expand_kv(k, heads), expand_kv(v, heads)
    p = probabilities(q, ke, causal, scale)
    o = p @ ve
    dv = _t(p) @ do
    dp = do @ _t(ve)
    ds = p * (dp - delta(o, do)[..., None])
    dq = scale * ds @ ke
    dk = scale * _t(ds) @ q
    fold = lambda g: g.reshape(b, kv_heads, heads // kv_heads, *g.shape[2:]).sum(axis=2)  # noqa: E731
    return dq, fold(dk), fold(dv)


def gradient_scale(q, k, v, do, causal=False, scale=None):
    """The size of the terms each gradient element sums (dq, dk, dv): the same products with every factor taken
    in absolute value. Gradients cancel (dS sums to zero along each row), so their error is judged against
    this size, not against their own value."""
    b, heads, m, d = q.shape
    kv_heads = k.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    ke, ve = np.abs(expand_kv(k, heads)), np.abs(expand_kv(v, heads))
    p = probabilities(q, expand_kv(k, heads), causal, scale)
    dp = np.abs(do) @ _t(ve)
    o_abs = p @ ve
    ds = p * (dp + (np.abs(do) * o_abs).sum(axis=-1, keepdims=True))
    fold = lambda g: g.reshape(b, kv_heads, heads // kv_heads, *g.shape[2:]).sum(axis=2)  # noqa: E731
    return scale * ds @ ke, fold(scale * _t(ds) @ np.abs(q)), fold(_t(p) @ np.abs(do))


def tiled_attention_backward(q, k, v, o, do, lse, block_m: int, block_n: int, causal: bool = False, scale=None):
    """FlashAttention-2's backward on (B, H, M, d) arrays as the three kernels run it, with HBM traffic counted in
    elements: the preprocessing pass (D from O and dO), a pass with one program per key block that streams the
    query blocks past it (dK, dV), and one with a program per query block that streams the key blocks (dQ).
    P is recomputed from the saved lse; no (M, N) matrix is ever stored. Returns (dq, dk, dv, traffic)."""
    b, h, m, d = q.shape
    n = k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    big_d = delta(o, do)
    reads, writes = 2 * o.size, big_d.size                               # preprocessing
    for z in np.ndindex(b, h):
        for first_key in range(0, n, block_n):
            cols = np.arange(first_key, min(first_key + block_n, n))
            reads += 2 * len(cols) * d                                   # K, V of the key block, once
            dk_j, dv_j = np.zeros((len(cols), d)), np.zeros((len(cols), d))
            for first in range(causal_first_query_block(first_key, block_m) if causal else 0, m, block_m):
                rows = np.arange(first, min(first + block_m, m))
                reads += 2 * len(rows) * d + 2 * len(rows)               # Q, dO, lse, D of the query block
                p = _recomputed(q[z][rows], k[z][cols], lse[z][rows], rows, cols, causal, scale)
                dv_j += p.T @ do[z][rows]
                ds = p * (do[z][rows] @ v[z][cols].T - big_d[z][rows][:, None])
                dk_j += scale * ds.T @ q[z][rows]
            dk[z][cols], dv[z][cols] = dk_j, dv_j
            writes += 2 * len(cols) * d
        for first in range(0, m, block_m):
            rows = np.arange(first, min(first + block_m, m))
            reads += 2 * len(rows) * d + 2 * len(rows)                   # Q, dO, lse, D, once
            dq_i = np.zeros((len(rows), d))
            stop = min(first + block_m, n) if causal else n
            for first_key in range(0, stop, block_n):
                cols = np.arange(first_key, min(first_key + block_n, n))
                reads += 2 * len(cols) * d                               # K, V of each key block
                p = _recomputed(q[z][rows], k[z][cols], lse[z][rows], rows, cols, causal, scale)
                ds = p * (do[z][rows] @ v[z][cols].T - big_d[z][rows][:, None])
                dq_i += scale * ds @ k[z][cols]
            dq[z][rows] = dq_i
            writes += len(rows) * d
    return dq, dk, dv, {"reads": reads, "writes": writes}


def _recomputed(q_tile, k_tile, lse_rows, rows, cols, causal, scale):
    """P of one tile from the saved log-sum-exp: exp(S − lse), masked entries 0."""
    s = scale * (q_tile @ k_tile.T)
    if causal:
        s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)
    return np.exp(s - np.where(np.isfinite(lse_rows), lse_rows, 0.0)[:, None])


def causal_first_query_block(first_key: int, block_m: int) -> int:
    """The first query block that sees key `first_key` under a top-left causal mask (query i sees keys <= i)."""
    return first_key // block_m * block_m


def backward_traffic(bh: int, m: int, n: int, d: int, block_m: int, block_n: int, causal: bool = False):
    """(reads, writes) in elements of tiled_attention_backward, in closed form, counting in the dQ pass the keys up
    to each query block's last query. The simulation loads whole key blocks, so with a causal mask it also reads the
    rest of the diagonal's last key block: the two agree when block_n divides block_m (or without a mask)."""
    reads, writes = bh * 2 * m * d, bh * m                               # preprocessing: O, dO in; D out
    query_rows = 0                                                       # Σ over key blocks of the query rows seen
    for first_key in range(0, n, block_n):
        first = causal_first_query_block(first_key, block_m) if causal else 0
        query_rows += max(m - first, 0)
    key_rows = sum(min(first + block_m, n) if causal else n for first in range(0, m, block_m))
    reads += bh * (2 * n * d + query_rows * (2 * d + 2))                 # dK/dV pass
    reads += bh * (m * (2 * d + 2) + 2 * key_rows * d)                   # dQ pass
    writes += bh * (2 * n * d + m * d)
    return reads, writes


def merge_splits(o_parts, lse_parts):
    """Split-K: S partial results over disjoint key ranges, o_parts (S, ..., d) each normalised by its own sum and
    lse_parts (S, ...) their natural-log sums, merged into (o, lse) over all the keys:
        lse = log Σ_s exp(lse_s),  o = Σ_s exp(lse_s − lse) · o_s.
    A split that saw no key has lse = -inf and weight 0; a row no split saw gives o = 0, lse = -inf."""
    top = lse_parts.max(axis=0)
    safe = np.where(np.isfinite(top), top, 0.0)
    weights = np.exp(lse_parts - safe)
    total = weights.sum(axis=0)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, safe + np.log(np.where(total > 0, total, 1.0)), -np.inf)
    o = (weights[..., None] * o_parts).sum(axis=0) / np.where(total > 0, total, 1.0)[..., None]
    return o, lse


def split_bounds(n: int, splits: int, block: int = 1):
    """Key ranges [start, stop) of `splits` programs sharing n keys, each a whole number of blocks (the last
    may be short, trailing ones empty)."""
    per = math.ceil(math.ceil(n / block) / splits) * block
    return [(min(s * per, n), min((s + 1) * per, n)) for s in range(splits)]


def varlen_attention(q, k, v, cu_seqlens, causal=False, scale=None):
    """Packed variable-length batch: q (T, H, d), k and v (T, Hkv, d), sequence i occupying rows
    cu_seqlens[i]:cu_seqlens[i+1]. Each sequence attends only to itself. Returns (o (T, H, d), lse (H, T))."""
    o, lse = np.zeros(q.shape), np.full((q.shape[1], q.shape[0]), -np.inf)
    for start, stop in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        if stop == start:
            continue
        heads = lambda x: np.swapaxes(x[start:stop], 0, 1)[None]  # noqa: E731  (1, H, L, d)
        o_i, lse_i = attention_forward(heads(q), heads(k), heads(v), causal, scale)
        o[start:stop] = np.swapaxes(o_i[0], 0, 1)
        lse[:, start:stop] = lse_i[0]
    return o, lse


def varlen_backward(q, k, v, do, cu_seqlens, causal=False, scale=None):
    """(dq, dk, dv) of varlen_attention, packed like the inputs."""
    grads = [np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)]
    for start, stop in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        if stop == start:
            continue
        heads = lambda x: np.swapaxes(x[start:stop], 0, 1)[None]  # noqa: E731
        for g, part in zip(grads, attention_backward(heads(q), heads(k), heads(v), heads(do), causal, scale)):
            g[start:stop] = np.swapaxes(part[0], 0, 1)
    return tuple(grads)
