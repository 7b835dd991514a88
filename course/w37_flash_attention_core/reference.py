"""Float64 NumPy references for week 37: the online tile update, FlashAttention's tiled forward with its
HBM traffic counted, the causal tile bounds. Masks follow week 35 (causal aligned top-left: query i sees
keys j <= i). Traffic is counted in elements moved between HBM and on-chip memory; in bytes it is
course/attention_cost.py's flash_attention_cost.
"""
import math

import numpy as np

from ..w35_attention_blocks.reference import attention_scores, masked_scores  # noqa: F401 (the week's checks)


def online_update(m, l, o, s, v):
    """One tile of the online softmax (Dao et al., 2022, Algorithm 1): running max m (Br,), running sum l (Br,),
    normalised output o (Br, d); s (Br, Bc) the tile's scaled scores (-inf where masked), v (Bc, d). Returns
    (m_new, l_new, o_new) with
        m_new = max(m, rowmax(s)),  P = exp(s - m_new),
        l_new = l·exp(m - m_new) + rowsum(P),  o_new = (o·l·exp(m - m_new) + P v) / l_new.
    A row that has seen no key yet (m_new = -inf) keeps m = -inf, l = 0, o = 0."""
    m_new = np.maximum(m, s.max(axis=1))
    seen = np.isfinite(m_new)
    base = np.where(seen, m_new, 0.0)
    p = np.exp(s - base[:, None])
    rescale = np.where(seen, np.exp(m - base), 0.0)
    l_new = l * rescale + p.sum(axis=1)
    total = np.where(l_new > 0, l_new, 1.0)
    o_new = (o * (l * rescale)[:, None] + p @ v) / total[:, None]
    return m_new, l_new, o_new


def causal_tile_bounds(pid_m: int, block_m: int, block_n: int, n: int):
    """Key range of query block pid_m under a top-left causal mask: keys [0, free) need no mask (every key is
    before every query of the block, and the blocks are whole), keys [free, stop) need one (the diagonal and
    the tail), keys from stop on are never loaded."""
    free = min(pid_m * block_m, n) // block_n * block_n
    stop = min((pid_m + 1) * block_m, n)
    return free, stop


def tiled_attention(q, k, v, block_m: int, block_n: int, causal: bool = False, scale=None):
    """FlashAttention's forward on (B, H, M, d) arrays, one query block at a time, key blocks streamed past it
    with online_update. Returns (o, lse, traffic): lse the natural log of each row's sum, traffic {"reads",
    "writes"} in elements: Q, O and the LSE once, K and V once per (query block, loaded key block)."""
    b, h, m, d = q.shape
    n = k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    o, lse = np.zeros(q.shape), np.full((b, h, m), -np.inf)
    reads = writes = 0
    for z in np.ndindex(b, h):
        for pid_m in range(math.ceil(m / block_m)):
            rows = np.arange(pid_m * block_m, min((pid_m + 1) * block_m, m))
            q_tile = q[z][rows]
            reads += q_tile.size
            m_i, l_i, o_i = np.full(len(rows), -np.inf), np.zeros(len(rows)), np.zeros((len(rows), d))
            stop = causal_tile_bounds(pid_m, block_m, block_n, n)[1] if causal else n
            for start in range(0, stop, block_n):
                cols = np.arange(start, min(start + block_n, n))
                k_tile, v_tile = k[z][cols], v[z][cols]
                reads += k_tile.size + v_tile.size
                s = scale * (q_tile @ k_tile.T)
                if causal:
                    s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)
                m_i, l_i, o_i = online_update(m_i, l_i, o_i, s, v_tile)
            o[z][rows] = o_i
            lse[z][rows] = np.where(l_i > 0, m_i + np.log(np.where(l_i > 0, l_i, 1.0)), -np.inf)
            writes += o_i.size + len(rows)
    return o, lse, {"reads": reads, "writes": writes}


def hbm_traffic(bh: int, m: int, n: int, d: int, block_m: int, block_n: int, causal: bool = False):
    """(reads, writes) in elements of tiled_attention, in closed form: Q once; K and V once per query block,
    only up to the diagonal's last key block with causal; O once and one LSE per query."""
    keys = 0
    for pid_m in range(math.ceil(m / block_m)):
        stop = causal_tile_bounds(pid_m, block_m, block_n, n)[1] if causal else n
        keys += stop  # the loaded blocks cover keys [0, stop); the last one may be partial
    return bh * (m * d + 2 * keys * d), bh * (m * d + m)


def sram_blocks(sram_bytes: int, d: int, element_size: int = 4):
    """The paper's block sizes for on-chip memory of M bytes: Bc = ceil(M / (4 d)) elements' worth of key rows,
    Br = min(Bc, d) (Dao et al., 2022, Algorithm 1, in elements of element_size bytes)."""
    m_elems = sram_bytes // element_size
    bc = math.ceil(m_elems / (4 * d))
    return min(bc, d), bc


def io_bound(n: int, d: int, sram_bytes: int, element_size: int = 4) -> float:
    """The paper's order of HBM accesses of the forward pass, N²d²/M elements (Dao et al., 2022, Theorem 2)."""
    return n * n * d * d / (sram_bytes / element_size)
