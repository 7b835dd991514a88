"""Your exercises. Generated from solutions/w40_advanced_fusion.py by `python -m course stubs`.

Replace every `YOUR CODE HERE` line with your code, then run the grading cell in the notebook
(or `python -m course grade w40.<exercise>`). The reference solutions are in solutions/w40_advanced_fusion.py:
try first, peek later.
"""
import functools
import math
import re

import numpy as np
import torch
import triton
import triton.language as tl

import course
from course.backend import ON_GPU
from course.heads import as_heads

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e); a constexpr, so kernels read it (the host: LOG2E.value)
# the earlier weeks whose kernels this week builds on (course.kernels: the learner's own in their edition)
W34, W35, W38, W39 = "w34_layernorm", "w35_attention_blocks", "w38_flash_attention_impl", "w39_kernel_fusion"
DOT_PRECISION = {torch.float32: "ieee", torch.float16: "tf32", torch.bfloat16: "tf32"}  # fp32 dots stay exact

# ---------------------------------------------------------------- day 1: CuTe layouts (NumPy)
def layout_index(shape, stride) -> np.ndarray:
    """The offsets L(i) of the layout shape:stride for every 1-D index i = 0 … size − 1, as a float64 array.
    `shape` and `stride` are congruent: both an int, or tuples of the same nesting whose entries are ints or
    tuples again ((4, (2, 2)) with (2, (1, 8)) is CuTe's (4,(2,2)):(2,(1,8))). The 1-D index runs
    colexicographically, as in CuTe: the FIRST mode varies fastest, and inside a nested mode its first mode too.
    Example: layout_index((2, 3), (3, 1)) -> [0, 3, 1, 4, 2, 5]."""
    # YOUR CODE HERE
    return offsets

# ---------------------------------------------------------------- day 2: reading the compiled kernel
def kernel_facts(ttgir: str, ptx: str) -> tuple[int, int, int, int]:
    """What Triton's compiler made of one kernel for sm_90, read off two of its listings:
    (wgmma, ex2, shared_bytes, warps).

    wgmma: the PTX's `wgmma.mma_async` instructions, the Hopper tensor-core MMAs that `tl.dot` became (not the
        `wgmma.fence`, `wgmma.commit_group` and `wgmma.wait_group` lines around them);
    ex2: the PTX's `ex2.approx` instructions (any modifiers: `.f32`, `.ftz.f32`), the exp2 of the special-function
        unit: one per element a thread holds, where the TTGIR has one `math.exp2` per tile;
    shared_bytes: the shared memory one program asks for, the TTGIR module attribute `ttg.shared` (bytes);
    warps: the TTGIR module attribute `ttg.num-warps`.
    A PTX instruction may carry a predicate before it (`@%p1 ex2.approx.f32 ...`); the module attributes sit on the
    TTGIR line that starts `module attributes {`."""
    # YOUR CODE HERE


# ---------------------------------------------------------------- day 3: linear attention
def chunk_recurrence(phi_k: np.ndarray, v: np.ndarray, chunk: int):
    """The state causal linear attention carries from chunk to chunk. phi_k (..., N, d) are the keys after the
    feature map, v (..., N, dv) the values; chunk c covers positions c·chunk … c·chunk + chunk − 1 (the last one may
    be shorter). Returns (states (..., C, d, dv), norms (..., C, d)): S_c = Σ φ(k_j) v_jᵀ and z_c = Σ φ(k_j) over
    the positions j before chunk c, so S_0 and z_0 are zero. One pass over the chunks, O(N·d·dv)."""
    n, d, dv = phi_k.shape[-2], phi_k.shape[-1], v.shape[-1]
    n_chunks = -(-n // chunk)
    states = np.zeros(phi_k.shape[:-2] + (n_chunks, d, dv))
    norms = np.zeros(phi_k.shape[:-2] + (n_chunks, d))
    state, norm = np.zeros(phi_k.shape[:-2] + (d, dv)), np.zeros(phi_k.shape[:-2] + (d,))
    # YOUR CODE HERE
    return states, norms


FEATURES = {"elu1": 0, "relu": 1}  # the feature maps the kernels know, by the number they are compiled with
LINEAR_EPS = 1e-6  # course/w40_advanced_fusion/reference.py's LINEAR_EPS: added to every normaliser


@triton.jit
def feature_map(x, inside, FEATURE: tl.constexpr):
    # φ(x) in float32, 0 outside the tensor (elu(0) + 1 is 1: a padded key or dimension must not count)
    if FEATURE == 0:
        phi = tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))
    else:
        phi = tl.maximum(x, 0.0)
    return tl.where(inside, phi, 0.0)


@triton.jit
def linear_states_kernel(k_ptr, v_ptr, s_ptr, z_ptr, N, D, DV, H, skb, skh, skn, svb, svh, svn, n_chunks,
                         CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, FEATURE: tl.constexpr,
                         STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # Program (key-dim block, value-dim block, b·H + h) walks one head's chunks in order, carrying S = Σ φ(k)ᵀv
    # (BLOCK_K × BLOCK_V, float32) and z = Σ φ(k): it stores the state BEFORE each chunk, then adds the chunk.
    # Reads K and V once; writes one state per chunk (B·H·C·d·dv elements).
    pid_k, pid_v, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    kd = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    vd = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    k_head = k_ptr + b * skb + h * skh
    v_head = v_ptr + b * svb + h * svh
    s_head = s_ptr + bh.to(tl.int64) * n_chunks * D * DV + kd[:, None] * DV + vd[None, :]
    z_head = z_ptr + bh.to(tl.int64) * n_chunks * D + kd
    state = tl.zeros([BLOCK_K, BLOCK_V], tl.float32)
    norm = tl.zeros([BLOCK_K], tl.float32)
    for c in tl.range(0, n_chunks, num_stages=STAGES):
        tl.store(s_head + c * D * DV, state.to(s_ptr.dtype.element_ty), mask=(kd[:, None] < D) & (vd[None, :] < DV))
        if pid_v == 0:
            tl.store(z_head + c * D, norm, mask=kd < D)
        pos = c * CHUNK + tl.arange(0, CHUNK)
        keys = (pos[:, None] < N) & (kd[None, :] < D)
        k = tl.load(k_head + pos[:, None] * skn + kd[None, :], mask=keys, other=0.0)
        v = tl.load(v_head + pos[:, None] * svn + vd[None, :], mask=(pos[:, None] < N) & (vd[None, :] < DV),
                    other=0.0)
        phi = feature_map(k.to(tl.float32), keys, FEATURE)
        state += tl.dot(tl.trans(phi.to(v.dtype)), v, input_precision=PRECISION)
        norm += tl.sum(phi, axis=0)


@triton.jit
def linear_output_kernel(q_ptr, k_ptr, v_ptr, s_ptr, z_ptr, o_ptr, N, D, DV, H, sqb, sqh, sqn, skb, skh, skn,
                         svb, svh, svn, sob, soh, son, n_chunks, eps, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_V: tl.constexpr, FEATURE: tl.constexpr, PRECISION: tl.constexpr):
    # Program (chunk c, value-dim block, b·H + h): the chunk's outputs from its own keys (the quadratic form under
    # the causal mask) and from every earlier chunk through the state S_c, z_c. Reads the chunk's Q, K, V and one
    # state; writes O once.
    c, pid_v, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    pos = c * CHUNK + tl.arange(0, CHUNK)
    dims = tl.arange(0, BLOCK_D)
    vd = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rows, values = (pos[:, None] < N) & (dims[None, :] < D), (pos[:, None] < N) & (vd[None, :] < DV)
    q = tl.load(q_ptr + b * sqb + h * sqh + pos[:, None] * sqn + dims[None, :], mask=rows, other=0.0)
    k = tl.load(k_ptr + b * skb + h * skh + pos[:, None] * skn + dims[None, :], mask=rows, other=0.0)
    v = tl.load(v_ptr + b * svb + h * svh + pos[:, None] * svn + vd[None, :], mask=values, other=0.0)
    phi_q = feature_map(q.to(tl.float32), rows, FEATURE)
    phi_k = feature_map(k.to(tl.float32), rows, FEATURE)
    s_at = s_ptr + (bh.to(tl.int64) * n_chunks + c) * D * DV
    state = tl.load(s_at + dims[:, None] * DV + vd[None, :], mask=(dims[:, None] < D) & (vd[None, :] < DV), other=0.0)
    norm = tl.load(z_ptr + (bh.to(tl.int64) * n_chunks + c) * D + dims, mask=dims < D, other=0.0)
    # YOUR CODE HERE
    tl.store(o_ptr + b * sob + h * soh + pos[:, None] * son + vd[None, :], o.to(o_ptr.dtype.element_ty), mask=values)


# (CHUNK, BLOCK_K = BLOCK_V of the states kernel, warps of the output kernel): on a GPU and in the interpreter
LINEAR_TILES = {"gpu": (64, 64, 4), "cpu": (16, 32, 4)}


def _linear_inputs(op: str, q, k, v, feature: str):
    q, k, v = (as_heads(t, op, name) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    if k.shape != q.shape or v.shape[:3] != q.shape[:3] or not q.dtype == k.dtype == v.dtype \
            or q.dtype not in DOT_PRECISION:
        raise ValueError(f"{op}: q and k must have the same shape (B, H, N, d), v (B, H, N, dv), all float16, "
                         f"bfloat16 or float32 alike; got q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)} {v.dtype}")
    if feature not in FEATURES:
        raise ValueError(f"{op}: unknown feature map {feature!r}; known: {', '.join(FEATURES)}")
    if max(q.shape[-1], v.shape[-1]) > 256:
        raise ValueError(f"{op}: head dims up to 256; got d = {q.shape[-1]}, dv = {v.shape[-1]}")
    return q, k, v


def causal_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature: str = "elu1",
                            chunk: int | None = None) -> torch.Tensor:
    """Causal linear attention, chunked: o_i = φ(q_i)·Σ_{j<=i} φ(k_j) v_jᵀ / (φ(q_i)·Σ_{j<=i} φ(k_j) + 1e-6), φ the
    feature map ("elu1": elu + 1, or "relu"). Two kernels: the states before every chunk (a sequential walk per
    head), then every chunk's outputs in parallel. q, k (B, H, N, d), v (B, H, N, dv); returns o like v."""
    q, k, v = _linear_inputs("causal_linear_attention", q, k, v, feature)
    (bsz, heads, n, d), dv = q.shape, v.shape[-1]
    tile, block_kv, warps = LINEAR_TILES["gpu" if ON_GPU else "cpu"]
    chunk = chunk or tile
    n_chunks = triton.cdiv(n, chunk)
    block_d, block_v = max(16, triton.next_power_of_2(d)), max(16, triton.next_power_of_2(dv))
    block_kv = min(block_kv, block_d, block_v)
    # the states feed a tensor-core dot in the inputs' dtype, so 16-bit inputs keep them in 16 bits (half the bytes)
    states = torch.empty((bsz * heads, n_chunks, d, dv), dtype=q.dtype, device=q.device)
    norms = torch.empty((bsz * heads, n_chunks, d), dtype=torch.float32, device=q.device)
    precision = DOT_PRECISION[q.dtype]
    linear_states_kernel[(triton.cdiv(d, block_kv), triton.cdiv(dv, block_kv), bsz * heads)](
        k, v, states, norms, n, d, dv, heads, *k.stride()[:3], *v.stride()[:3], n_chunks, CHUNK=chunk,
        BLOCK_K=block_kv, BLOCK_V=block_kv, FEATURE=FEATURES[feature], STAGES=2 if ON_GPU else 1,
        PRECISION=precision, num_warps=4)
    o = torch.empty((bsz, heads, n, dv), dtype=q.dtype, device=q.device)
    linear_output_kernel[(n_chunks, triton.cdiv(dv, block_v), bsz * heads)](
        q, k, v, states, norms, o, n, d, dv, heads, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        *o.stride()[:3], n_chunks, LINEAR_EPS, CHUNK=chunk, BLOCK_D=block_d, BLOCK_V=block_v,
        FEATURE=FEATURES[feature], PRECISION=precision, num_warps=warps)
    return o


# ---------------------------------------------------------------- day 4: block-sparse attention
def block_tile_list(keep: np.ndarray, block_m: int, block_n: int):
    """The tile lists a block-sparse kernel walks, from a (M, N) boolean mask (keep[i, j]: query i sees key j).
    Per block of block_m queries (Tm = ceil(M / block_m) of them), the key tiles of block_n keys (Tn of them) with at
    least one kept pair, in two lists: partial tiles (some pair of the block_m × block_n tile masked, or the tile
    runs past M or N, so the kernel must apply the mask) and full tiles (every pair kept: no mask needed). Returns
    (partial_count (Tm,), partial_index (Tm, Tn), full_count (Tm,), full_index (Tm, Tn)) as int arrays; each row
    lists its tile numbers in ascending order, then −1."""
    keep = np.asarray(keep, dtype=bool)
    m, n = keep.shape
    tm, tn = -(-m // block_m), -(-n // block_n)
    partial_index, full_index = np.full((tm, tn), -1), np.full((tm, tn), -1)
    # YOUR CODE HERE
    return (partial_index >= 0).sum(axis=1), partial_index, (full_index >= 0).sum(axis=1), full_index


class SparsePattern:
    """A mask (causal, a sliding window of `window` keys, documents: one id per position) over N queries and keys,
    with the tile lists of the kernels below at SPARSE_BLOCK granularity: per query block the key blocks to visit
    (forward, dq) and per key block the query blocks (dk, dv), partial and full apart. Built once per mask, like
    FlexAttention's create_block_mask; the kernels' tiles divide SPARSE_BLOCK."""

    def __init__(self, n: int, causal: bool = True, window: int | None = None, documents=None, block: int | None = None,
                 device=None):
        from course.w40_advanced_fusion.reference import token_mask
        self.n, self.causal, self.window = n, bool(causal), window
        self.block = block or SPARSE_BLOCK["gpu" if ON_GPU else "cpu"]
        device = device or ("cuda" if ON_GPU else "cpu")
        docs = None if documents is None else np.asarray(documents, dtype=np.int64)
        keep = token_mask(n, n, causal, window, docs)
        as_int = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.int32, device=device).contiguous()  # noqa: E731
        self.by_query = tuple(as_int(a) for a in block_tile_list(keep, self.block, self.block))
        self.by_key = tuple(as_int(a) for a in block_tile_list(keep.T, self.block, self.block))
        self.documents = as_int(docs if docs is not None else np.zeros(1))
        self.density = float(keep.mean())

    def mask_meta(self):
        return {"CAUSAL": self.causal, "WINDOW": self.window is not None, "DOCS": self.documents.numel() > 1}


SPARSE_BLOCK = {"gpu": 128, "cpu": 32}


@triton.jit
def sparse_keep(rows, cols, M, N, doc_ptr, window, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOCS: tl.constexpr):
    # the mask of a partial tile: inside the tensor, and causal, within the window, in the same document
    keep = (rows[:, None] < M) & (cols[None, :] < N)
    if CAUSAL:
        keep = keep & (cols[None, :] <= rows[:, None])
        if WINDOW:
            keep = keep & (rows[:, None] - cols[None, :] < window)
    elif WINDOW:
        keep = keep & (rows[:, None] - cols[None, :] < window) & (cols[None, :] - rows[:, None] < window)
    if DOCS:
        keep = keep & (tl.load(doc_ptr + rows, mask=rows < M, other=-1)[:, None]
                       == tl.load(doc_ptr + cols, mask=cols < N, other=-2)[None, :])
    return keep


@triton.jit
def _sparse_forward_tiles(acc, m_i, l_i, q, k_head, v_head, rows, dims, count_ptr, index_ptr, tile_row, n_tiles, N, D,
                          skn, svn, qk_scale, doc_ptr, window, SPARSE: tl.constexpr, BLOCK_N: tl.constexpr,
                          MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOCS: tl.constexpr,
                          STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # The key blocks listed for this query block (full ones, or with MASKED the partial ones), BLOCK_N keys at a
    # time, folded into the online softmax (base 2: qk_scale = scale·log2 e).
    count = tl.load(count_ptr + tile_row)
    for t in tl.range(0, count * (SPARSE // BLOCK_N), num_stages=STAGES):
        block = tl.load(index_ptr + tile_row * n_tiles + t // (SPARSE // BLOCK_N))
        cols = block * SPARSE + (t % (SPARSE // BLOCK_N)) * BLOCK_N + tl.arange(0, BLOCK_N)
        k_t = tl.load(k_head + cols[None, :] * skn + dims[:, None], mask=(cols[None, :] < N) & (dims[:, None] < D),
                      other=0.0)
        s = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale
        if MASKED:
            s = tl.where(sparse_keep(rows, cols, N, N, doc_ptr, window, CAUSAL, WINDOW, DOCS), s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_head + cols[:, None] * svn + dims[None, :], mask=(cols[:, None] < N) & (dims[None, :] < D),
                    other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def sparse_forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, doc_ptr, pc_ptr, pi_ptr, fc_ptr, fi_ptr, N, D, H,
                          qk_scale, window, n_tiles, sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
                          SPARSE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                          CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOCS: tl.constexpr, STAGES: tl.constexpr,
                          PRECISION: tl.constexpr):
    # Program (query block, b·H + h): FlashAttention-2's forward over the key tiles its sparse row lists: the full
    # tiles with no mask, then the partial ones with it; tiles not listed are never read. Writes O and the LSE.
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    inside = (rows[:, None] < N) & (dims[None, :] < D)
    q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :], mask=inside, other=0.0)
    k_head, v_head = k_ptr + b * skb + h * skh, v_ptr + b * svb + h * svh
    tile_row = pid_m * BLOCK_M // SPARSE
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    acc, m_i, l_i = _sparse_forward_tiles(acc, m_i, l_i, q, k_head, v_head, rows, dims, fc_ptr, fi_ptr, tile_row,
                                          n_tiles, N, D, skn, svn, qk_scale, doc_ptr, window, SPARSE, BLOCK_N, False,
                                          CAUSAL, WINDOW, DOCS, STAGES, PRECISION)
    acc, m_i, l_i = _sparse_forward_tiles(acc, m_i, l_i, q, k_head, v_head, rows, dims, pc_ptr, pi_ptr, tile_row,
                                          n_tiles, N, D, skn, svn, qk_scale, doc_ptr, window, SPARSE, BLOCK_N, True,
                                          CAUSAL, WINDOW, DOCS, STAGES, PRECISION)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    tl.store(o_ptr + b * sob + h * soh + rows[:, None] * som + dims[None, :],
             (acc / l_safe[:, None]).to(o_ptr.dtype.element_ty), mask=inside)
    lse = tl.where(l_i > 0, (m_i + tl.log2(l_safe)) / LOG2E, -float("inf"))
    tl.store(lse_ptr + bh.to(tl.int64) * N + rows, lse, mask=rows < N)


@triton.jit
def _sparse_dkdv_tiles(dk, dv, k, v, q_head, do_head, lse_head, delta_head, cols, dims, count_ptr, index_ptr,
                       tile_col, n_tiles, N, D, sqm, sdm, qk_scale, doc_ptr, window, SPARSE: tl.constexpr,
                       BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                       DOCS: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # The query blocks listed for this key block, BLOCK_M queries at a time: Pᵀ recomputed from the LSE,
    # dV += Pᵀ dO, dSᵀ = Pᵀ ∘ (dPᵀ − Δ), dK += dSᵀ Q (the softmax scale once, after the loop).
    count = tl.load(count_ptr + tile_col)
    for t in tl.range(0, count * (SPARSE // BLOCK_M), num_stages=STAGES):
        block = tl.load(index_ptr + tile_col * n_tiles + t // (SPARSE // BLOCK_M))
        rows = block * SPARSE + (t % (SPARSE // BLOCK_M)) * BLOCK_M + tl.arange(0, BLOCK_M)
        inside = (rows[:, None] < N) & (dims[None, :] < D)
        q = tl.load(q_head + rows[:, None] * sqm + dims[None, :], mask=inside, other=0.0)
        do = tl.load(do_head + rows[:, None] * sdm + dims[None, :], mask=inside, other=0.0)
        lse = tl.load(lse_head + rows, mask=rows < N, other=0.0) * LOG2E
        delta = tl.load(delta_head + rows, mask=rows < N, other=0.0)
        p_t = tl.exp2(tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale - lse[None, :])
        if MASKED:
            p_t = tl.where(tl.trans(sparse_keep(rows, cols, N, N, doc_ptr, window, CAUSAL, WINDOW, DOCS)), p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=PRECISION)
        ds_t = p_t * (tl.dot(v, tl.trans(do), input_precision=PRECISION) - delta[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision=PRECISION)
    return dk, dv


@triton.jit
def _sparse_dkdv_program(pid_n, bh, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, doc_ptr, pc_ptr,
                         pi_ptr, fc_ptr, fi_ptr, N, D, H, qk_scale, sm_scale, window, n_tiles, sqb, sqh, sqm, skb,
                         skh, skn, svb, svh, svn, sdb, sdh, sdm, SPARSE: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                         DOCS: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # Program (key block pid_n, b·H + h) keeps BLOCK_N keys and values on chip and streams past them the query
    # blocks its sparse column lists (full, then partial); writes dK and dV (laid out like k) once.
    b, h = bh // H, bh % H
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    inside = (cols[:, None] < N) & (dims[None, :] < D)
    k = tl.load(k_ptr + b * skb + h * skh + cols[:, None] * skn + dims[None, :], mask=inside, other=0.0)
    v = tl.load(v_ptr + b * svb + h * svh + cols[:, None] * svn + dims[None, :], mask=inside, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    q_head, do_head = q_ptr + b * sqb + h * sqh, do_ptr + b * sdb + h * sdh
    lse_head, delta_head = lse_ptr + bh.to(tl.int64) * N, delta_ptr + bh.to(tl.int64) * N
    tile_col = pid_n * BLOCK_N // SPARSE
    dk, dv = _sparse_dkdv_tiles(dk, dv, k, v, q_head, do_head, lse_head, delta_head, cols, dims, fc_ptr, fi_ptr,
                                tile_col, n_tiles, N, D, sqm, sdm, qk_scale, doc_ptr, window, SPARSE, BLOCK_M, False,
                                CAUSAL, WINDOW, DOCS, STAGES, PRECISION)
    dk, dv = _sparse_dkdv_tiles(dk, dv, k, v, q_head, do_head, lse_head, delta_head, cols, dims, pc_ptr, pi_ptr,
                                tile_col, n_tiles, N, D, sqm, sdm, qk_scale, doc_ptr, window, SPARSE, BLOCK_M, True,
                                CAUSAL, WINDOW, DOCS, STAGES, PRECISION)
    out = b * skb + h * skh + cols[:, None] * skn + dims[None, :]
    tl.store(dk_ptr + out, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=inside)
    tl.store(dv_ptr + out, dv.to(dv_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _sparse_dq_tiles(dq, q, do, lse, delta, k_head, v_head, rows, dims, count_ptr, index_ptr, tile_row, n_tiles, N, D,
                     skn, svn, qk_scale, doc_ptr, window, SPARSE: tl.constexpr, BLOCK_N: tl.constexpr,
                     MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOCS: tl.constexpr,
                     STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # The key blocks listed for this query block: P recomputed, dS = P ∘ (dO Vᵀ − Δ), dQ += dS K.
    count = tl.load(count_ptr + tile_row)
    for t in tl.range(0, count * (SPARSE // BLOCK_N), num_stages=STAGES):
        block = tl.load(index_ptr + tile_row * n_tiles + t // (SPARSE // BLOCK_N))
        cols = block * SPARSE + (t % (SPARSE // BLOCK_N)) * BLOCK_N + tl.arange(0, BLOCK_N)
        inside = (cols[:, None] < N) & (dims[None, :] < D)
        k = tl.load(k_head + cols[:, None] * skn + dims[None, :], mask=inside, other=0.0)
        v = tl.load(v_head + cols[:, None] * svn + dims[None, :], mask=inside, other=0.0)
        p = tl.exp2(tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale - lse[:, None])
        if MASKED:
            p = tl.where(sparse_keep(rows, cols, N, N, doc_ptr, window, CAUSAL, WINDOW, DOCS), p, 0.0)
        ds = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    return dq


@triton.jit
def _sparse_dq_program(pid_m, bh, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, doc_ptr, pc_ptr, pi_ptr,
                       fc_ptr, fi_ptr, N, D, H, qk_scale, sm_scale, window, n_tiles, sqb, sqh, sqm, skb, skh, skn,
                       svb, svh, svn, sdb, sdh, sdm, SPARSE: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                       DOCS: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # Program (query block pid_m, b·H + h) keeps its queries, dO, LSE and Δ on chip and streams the listed key
    # tiles past them; writes dQ (laid out like q) once.
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    inside = (rows[:, None] < N) & (dims[None, :] < D)
    q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :], mask=inside, other=0.0)
    do = tl.load(do_ptr + b * sdb + h * sdh + rows[:, None] * sdm + dims[None, :], mask=inside, other=0.0)
    lse = tl.load(lse_ptr + bh.to(tl.int64) * N + rows, mask=rows < N, other=0.0) * LOG2E
    delta = tl.load(delta_ptr + bh.to(tl.int64) * N + rows, mask=rows < N, other=0.0)
    k_head, v_head = k_ptr + b * skb + h * skh, v_ptr + b * svb + h * svh
    tile_row = pid_m * BLOCK_M // SPARSE
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dq = _sparse_dq_tiles(dq, q, do, lse, delta, k_head, v_head, rows, dims, fc_ptr, fi_ptr, tile_row, n_tiles, N, D,
                          skn, svn, qk_scale, doc_ptr, window, SPARSE, BLOCK_N, False, CAUSAL, WINDOW, DOCS, STAGES,
                          PRECISION)
    dq = _sparse_dq_tiles(dq, q, do, lse, delta, k_head, v_head, rows, dims, pc_ptr, pi_ptr, tile_row, n_tiles, N, D,
                          skn, svn, qk_scale, doc_ptr, window, SPARSE, BLOCK_N, True, CAUSAL, WINDOW, DOCS, STAGES,
                          PRECISION)
    tl.store(dq_ptr + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :],
             (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=inside)


@triton.jit
def sparse_backward_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, doc_ptr, qpc_ptr,
                           qpi_ptr, qfc_ptr, qfi_ptr, kpc_ptr, kpi_ptr, kfc_ptr, kfi_ptr, N, D, H, qk_scale, sm_scale,
                           window, n_tiles, key_programs, sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdb, sdh, sdm,
                           SPARSE: tl.constexpr, KEY_M: tl.constexpr, KEY_N: tl.constexpr, QUERY_M: tl.constexpr,
                           QUERY_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                           DOCS: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # One launch for the whole backward (FlexAttention's layout): programs 0 … key_programs − 1 of each head own a
    # key block (dK, dV, tiles KEY_M × KEY_N), the others a query block (dQ, tiles QUERY_M × QUERY_N), so the two
    # kinds share the GPU instead of the second waiting for the first's tail. dq, dk, dv are laid out like q, k, v.
    pid, bh = tl.program_id(0), tl.program_id(1)
    if pid < key_programs:
        _sparse_dkdv_program(pid, bh, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, doc_ptr, kpc_ptr,
                             kpi_ptr, kfc_ptr, kfi_ptr, N, D, H, qk_scale, sm_scale, window, n_tiles, sqb, sqh, sqm,
                             skb, skh, skn, svb, svh, svn, sdb, sdh, sdm, SPARSE, KEY_M, KEY_N, BLOCK_D, CAUSAL,
                             WINDOW, DOCS, STAGES, PRECISION)
    else:
        _sparse_dq_program(pid - key_programs, bh, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, doc_ptr,
                           qpc_ptr, qpi_ptr, qfc_ptr, qfi_ptr, N, D, H, qk_scale, sm_scale, window, n_tiles, sqb, sqh,
                           sqm, skb, skh, skn, svb, svh, svn, sdb, sdh, sdm, SPARSE, QUERY_M, QUERY_N, BLOCK_D, CAUSAL,
                           WINDOW, DOCS, STAGES, PRECISION)


# (BLOCK_M, BLOCK_N, warps, stages): the forward's tiles, and the backward's for its key programs (dK, dV) and its
# query programs (dQ), which share one launch and so one warp count. Every tile divides SPARSE_BLOCK.
SPARSE_TILES = {"gpu": {"forward": (64, 64, 4, 3), "key": (64, 128, 8, 2), "query": (128, 64, 8, 2)},
                "cpu": {"forward": (32, 16, 4, 1), "key": (16, 32, 4, 1), "query": (32, 16, 4, 1)}}


def _sparse_inputs(op: str, q, k, v, pattern: SparsePattern):
    q, k, v = (as_heads(t, op, name) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    if not q.shape == k.shape == v.shape or not q.dtype == k.dtype == v.dtype or q.dtype not in DOT_PRECISION:
        raise ValueError(f"{op}: q, k, v must share one shape (B, H, N, d) and dtype (float16, bfloat16, float32); "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not isinstance(pattern, SparsePattern) or pattern.n != q.shape[2]:
        raise ValueError(f"{op}: pattern must be a SparsePattern over the sequence's {q.shape[2]} positions")
    if q.shape[-1] > 256:
        raise ValueError(f"{op}: head_dim up to 256; got {q.shape[-1]}")
    return q, k, v


def _sparse_meta(pattern: SparsePattern, d: int, dtype) -> dict:
    return {"SPARSE": pattern.block, "BLOCK_D": max(16, triton.next_power_of_2(d)), "PRECISION": DOT_PRECISION[dtype],
            **pattern.mask_meta()}


def sparse_attention_forward(q, k, v, pattern: SparsePattern, scale=None):
    """Block-sparse attention's forward: (o, lse) of softmax attention under `pattern`'s mask, visiting only the
    tiles its lists name. o like q; lse (B, H, N) float32, natural log."""
    q, k, v = _sparse_inputs("sparse_attention", q, k, v, pattern)
    (bsz, heads, n, d) = q.shape
    scale = 1 / math.sqrt(d) if scale is None else float(scale)
    o = torch.empty_like(q)
    lse = torch.empty((bsz, heads, n), dtype=torch.float32, device=q.device)
    block_m, block_n, warps, stages = SPARSE_TILES["gpu" if ON_GPU else "cpu"]["forward"]
    sparse_forward_kernel[(triton.cdiv(n, block_m), bsz * heads)](
        q, k, v, o, lse, pattern.documents, *pattern.by_query, n, d, heads, scale * LOG2E.value, pattern.window or 0,
        pattern.by_query[1].shape[1], *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
        BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, num_warps=warps, num_stages=stages,
        **_sparse_meta(pattern, d, q.dtype))
    return o, lse


def sparse_attention_backward(q, k, v, o, do, lse, pattern: SparsePattern, scale=None):
    """(dq, dk, dv) of sparse_attention_forward for the upstream gradient do: Δ = rowsum(dO ∘ O) (week 38's
    kernel), then one launch whose key programs write dK, dV and whose query programs write dQ."""
    q, k, v = _sparse_inputs("sparse_attention_backward", q, k, v, pattern)
    do = as_heads(do, "sparse_attention_backward", "do")
    (bsz, heads, n, d) = q.shape
    scale = 1 / math.sqrt(d) if scale is None else float(scale)
    delta = course.kernels(W38).attention_delta(o, do)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    if not (dq.stride() == q.stride() and dk.stride() == k.stride() and dv.stride() == k.stride()):
        k, v, dk, dv = k.contiguous(), v.contiguous(), *(torch.empty_like(t.contiguous()) for t in (k, v))
        q, dq = q.contiguous(), torch.empty_like(q.contiguous())
    tiles = SPARSE_TILES["gpu" if ON_GPU else "cpu"]
    (key_m, key_n, warps, stages), (query_m, query_n, _, _) = tiles["key"], tiles["query"]
    key_programs = triton.cdiv(n, key_n)
    sparse_backward_kernel[(key_programs + triton.cdiv(n, query_m), bsz * heads)](
        q, k, v, do, lse, delta, dq, dk, dv, pattern.documents, *pattern.by_query, *pattern.by_key, n, d, heads,
        scale * LOG2E.value, scale, pattern.window or 0, pattern.by_query[1].shape[1], key_programs, *q.stride()[:3],
        *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], KEY_M=key_m, KEY_N=key_n, QUERY_M=query_m,
        QUERY_N=query_n, STAGES=stages, num_warps=warps, num_stages=stages, **_sparse_meta(pattern, d, q.dtype))
    return dq, dk, dv


class SparseAttention(torch.autograd.Function):
    """Block-sparse attention with the kernels above, differentiable: `SparseAttention.apply(q, k, v, pattern)`."""

    @staticmethod
    def forward(ctx, q, k, v, pattern, scale=None):
        o, lse = sparse_attention_forward(q, k, v, pattern, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.pattern, ctx.scale = pattern, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        return (*sparse_attention_backward(q, k, v, o, do.contiguous(), lse, ctx.pattern, ctx.scale), None, None)


def sparse_attention(q, k, v, pattern: SparsePattern, scale=None) -> torch.Tensor:
    """o of block-sparse attention under `pattern` (differentiable)."""
    return SparseAttention.apply(q, k, v, pattern, scale)


# ---------------------------------------------------------------- day 5: where a kernel sits on the roofline (NumPy)
def roofline_bound(flops, nbytes, ms, peak_tflops: float, peak_gbps: float):
    """Where kernels sit on the roofline of a GPU with `peak_tflops` (TFLOP/s) and `peak_gbps` (GB/s). flops, nbytes
    and ms are arrays, one entry per kernel: its FLOPs, the bytes it moves through HBM, its time in milliseconds.
    Returns five arrays: the arithmetic intensity flops / nbytes (FLOP per byte); the attainable rate, the lower of
    the two roofs, min(peak, intensity × bandwidth), in TFLOP/s; the achieved rate flops / time in TFLOP/s; the share
    of the roofline reached: the least time the roofline allows, max(flops / peak, nbytes / bandwidth), over the
    measured time (so a kernel with no FLOPs is judged by its bandwidth); and the bound, 1.0 where the intensity
    reaches the ridge point peak / bandwidth (compute-bound), 0.0 below it (memory-bound)."""
    flops, nbytes, ms = (np.asarray(a, dtype=np.float64) for a in (flops, nbytes, ms))
    # YOUR CODE HERE
    return intensity, attainable, achieved, share, bound


# ---------------------------------------------------------------- day 6: the capstone block
# The block is assembled from earlier weeks' kernels, reached through course.registry.kernels (in the learner's
# edition: the learner's own). Matrix products stay with cuBLAS (torch.matmul): the course stands on it, as FlashAttention
# stands on the tensor cores.


class Rotary(torch.autograd.Function):
    """RoPE with week 35's kernel: `Rotary.apply(x, cos, sin)`. A rotation's gradient is the rotation back (sin → −sin)."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return course.kernels(W35).rope(x, cos, sin)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return course.kernels(W35).rope(dy.contiguous(), cos, -sin), None, None


class DropoutResidualRMSNorm(torch.autograd.Function):
    """h = residual + dropout(x), y = RMSNorm(h)·weight in one kernel (week 39), both outputs differentiable:
    `y, h = DropoutResidualRMSNorm.apply(x, residual, weight, p, seed, offset)`. The backward runs week 34's RMSNorm
    backward from the saved h and rstd, adds the gradient h receives as the residual stream, and draws the mask
    again for x (week 39)."""

    @staticmethod
    def forward(ctx, x, residual, weight, p, seed, offset):
        y, h, rstd = course.kernels(W39).dropout_residual_rmsnorm(x.contiguous(), residual.contiguous(), weight, p, seed,
                                                           offset)
        ctx.save_for_backward(h, weight, rstd)
        ctx.dropout = (p, seed, offset)
        return y, h

    @staticmethod
    def backward(ctx, dy, dh):
        h, weight, rstd = ctx.saved_tensors
        d_norm, dweight, _ = course.kernels(W34).norm_backward(h, weight, dy.contiguous(), None, rstd)
        total = d_norm if dh is None else d_norm + dh
        return course.kernels(W39).dropout_residual_backward(total, *ctx.dropout), total, dweight, None, None, None


class DropoutResidual(torch.autograd.Function):
    """y = residual + dropout(x) with week 39's kernels: `DropoutResidual.apply(x, residual, p, seed, offset)`."""

    @staticmethod
    def forward(ctx, x, residual, p, seed, offset):
        ctx.dropout = (p, seed, offset)
        return course.kernels(W39).dropout_residual_forward(x.contiguous(), residual.contiguous(), p, seed, offset)

    @staticmethod
    def backward(ctx, dy):
        dy = dy.contiguous()
        return course.kernels(W39).dropout_residual_backward(dy, *ctx.dropout), dy, None, None, None


@functools.lru_cache(maxsize=16)
def rope_tables(n: int, d: int, device: str):
    """cos and sin (n, d/2) of week 35's RoPE angles t·base^(−2i/d), base 10000, float32 on `device`."""
    angles = torch.outer(torch.arange(n, dtype=torch.float64), 10000.0 ** (-2 * torch.arange(d // 2) / d))
    return angles.cos().float().to(device), angles.sin().float().to(device)


def capstone_block(x: torch.Tensor, w_norm1: torch.Tensor, w_qkv: torch.Tensor, w_o: torch.Tensor,
                   w_norm2: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, n_heads: int,
                   p: float = 0.0, seed: int = 0, attention=None) -> torch.Tensor:
    """A pre-norm transformer block (Llama's order) from the course's kernels, differentiable end to end:
        h   = x + dropout(attention(RoPE(q), RoPE(k), v) W_oᵀ),  q, k, v = RMSNorm(x)·w_norm1 W_qkvᵀ (causal)
        out = h + dropout(W_down(silu(gate) ∘ up)),             gate, up = RMSNorm(h)·w_norm2 W_gate_upᵀ
    x (B, N, C); w_qkv (3C, C) stacks the q, k, v projections (rows 0…C−1 are q's); w_gate_up (2F, C) stacks gate
    and up; w_down (C, F); w_norm1, w_norm2 (C,). The two dropouts draw at offsets 0 and x.numel() of `seed`'s
    stream. Kernels: RMSNorm (week 34), RoPE (week 35), FlashAttention (week 38), dropout + residual + RMSNorm,
    SwiGLU and dropout + residual (week 39). `attention(q, k, v)` replaces the causal attention if given (day 5
    measures the block with a production kernel there)."""
    bsz, n, c = x.shape
    d = c // n_heads
    cos, sin = rope_tables(n, d, str(x.device))
    attention = attention or functools.partial(course.kernels(W38).flash_attn, causal=True)
    # YOUR CODE HERE
    return out

def capstone_stages(x, w_norm1, w_qkv, w_o, w_norm2, w_gate_up, w_down, n_heads: int, p: float = 0.0,
                    seed: int = 0) -> dict:
    """Every kernel of capstone_block's training step as a zero-argument callable on the step's own tensors, forward
    then backward (names as reference.capstone_stage_costs): the benchmark times them one at a time for the
    per-kernel breakdown and the roofline. The tensors each one reads are made once, here."""
    k34, k35, k38, k39 = (course.kernels(week) for week in (W34, W35, W38, W39))
    bsz, n, c = x.shape
    d, f, t = c // n_heads, w_gate_up.shape[0] // 2, bsz * n
    cos, sin = rope_tables(n, d, str(x.device))
    w_gate, w_up = w_gate_up[:f], w_gate_up[f:]
    y, rstd1 = k34.rmsnorm(x, w_norm1)
    q, k, v = (y @ w_qkv.T).view(bsz, n, 3, n_heads, d).permute(2, 0, 3, 1, 4).unbind(0)
    q_turned, k_turned = k35.rope(q, cos, sin), k35.rope(k, cos, sin)
    o, lse = k38.flash_forward(q_turned, k_turned, v, True)
    attended = o.transpose(1, 2).reshape(t, c)
    y2, h, rstd2 = k39.dropout_residual_rmsnorm(attended.view(bsz, n, c) @ w_o.T, x, w_norm2, p, seed, 0)
    y2 = y2.view(t, c)
    gate, up = y2 @ w_gate.T, y2 @ w_up.T
    act = k39.swiglu(gate, up)
    down = (act @ w_down.T).view(bsz, n, c)
    dy = torch.randn_like(x)
    d_act, d_gate, d_up = (torch.randn_like(a) for a in (act, gate, up))
    d_rows, d_heads = torch.randn(t, c, dtype=x.dtype, device=x.device), torch.randn_like(o)
    d_qkv = torch.randn(t, 3 * c, dtype=x.dtype, device=x.device)
    x2 = x.view(t, c)
    return {
        "rmsnorm": lambda: k34.rmsnorm(x, w_norm1),
        "qkv projection": lambda: y.view(t, c) @ w_qkv.T,
        "rope (q and k)": lambda: (k35.rope(q, cos, sin), k35.rope(k, cos, sin)),
        "attention": lambda: k38.flash_forward(q_turned, k_turned, v, True),
        "output projection": lambda: attended @ w_o.T,
        "dropout + residual + rmsnorm": lambda: k39.dropout_residual_rmsnorm(down, x, w_norm2, p, seed, 0),
        "gate and up projections": lambda: (y2 @ w_gate.T, y2 @ w_up.T),
        "swiglu": lambda: k39.swiglu(gate, up),
        "down projection": lambda: act @ w_down.T,
        "dropout + residual": lambda: k39.dropout_residual_forward(down, h, p, seed, x.numel()),
        "dropout + residual backward": lambda: k39.dropout_residual_backward(dy, p, seed, x.numel()),
        "down projection backward": lambda: (d_rows @ w_down, d_rows.T @ act),
        "swiglu backward": lambda: k39.swiglu_backward(gate, up, d_act),
        "gate and up projections backward": lambda: (d_gate @ w_gate + d_up @ w_up, d_gate.T @ y2, d_up.T @ y2),
        "dropout + residual + rmsnorm backward": lambda: k39.dropout_residual_backward(
            k34.norm_backward(h, w_norm2, dy, None, rstd2)[0] + dy, p, seed, 0),
        "output projection backward": lambda: (d_rows @ w_o, d_rows.T @ attended),
        "attention backward": lambda: k38.flash_backward(q_turned, k_turned, v, o, d_heads, lse, True),
        "rope backward (q and k)": lambda: (k35.rope(d_heads, cos, -sin), k35.rope(d_heads, cos, -sin)),
        "qkv projection backward": lambda: (d_qkv @ w_qkv, d_qkv.T @ y.view(t, c)),
        "rmsnorm backward": lambda: k34.norm_backward(x2, w_norm1, d_rows, None, rstd1),
    }


# ---------------------------------------------------------------- day 1: a CuTe GEMM in NVIDIA's CUTLASS Python DSL
# C = A·Bᵀ written with CuTe, through NVIDIA's CUTLASS Python DSL (nvidia-cutlass-dsl 4.8.1): week 37's tile loop
# with CuTe's vocabulary. Each CTA owns a (BM, BN) tile of C; it walks K in BK steps, copying a (BM, BK) tile of A
# and a (BN, BK) tile of B to shared memory with a tiled copy, and multiplies them with tensor-core MMA atoms into
# float32 accumulators in registers. Inputs: A (M, K) and B (N, K), bf16 or fp16, row-major. Clarity over speed: one
# shared-memory stage, no software pipeline, no swizzle; sizes are padded to whole tiles on the host.

try:  # the DSL ships for Python 3.12 with a CUDA driver; elsewhere the lesson shows recorded results
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import from_dlpack
    from cutlass.memory import SmemAllocator  # 4.8's home of it (cutlass.utils.SmemAllocator is deprecated)
    CUTE_AVAILABLE, CUTE_REASON = True, ""
except Exception as err:  # noqa: BLE001 - any failure to import means: not on this machine
    CUTE_AVAILABLE, CUTE_REASON = False, f"the CUTLASS Python DSL cannot be imported here ({type(err).__name__}: {err})"

BM, BN, BK = 64, 64, 32  # the CTA's tile of C, and the K step
PAD = 8                  # shared-memory row padding (elements): rows stay 16-byte aligned, spread over more banks
THREADS = 128            # 4 warps, one MMA atom each per step (2 × 2 of them over M × N)

if CUTE_AVAILABLE:
    @cute.kernel
    def gemm_kernel(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, s_layout: cute.Layout,
                    tiled_copy: cute.TiledCopy, tiled_mma: cute.TiledMma):
        # One CTA per (BM, BN) tile of C: reads BM·K of A and BN·K of B, writes BM·BN of C.
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()

        # This CTA's tiles, by local_tile (a zipped_divide of the matrix, then one tile's slice):
        # gA (BM, BK, k), gB (BN, BK, k) — the last mode picks the K step — and gC (BM, BN).
        tile = (BM, BN, BK)
        gA = cute.local_tile(mA, tiler=tile, coord=(bidx, bidy, None), proj=(1, None, 1))
        gB = cute.local_tile(mB, tiler=tile, coord=(bidx, bidy, None), proj=(None, 1, 1))
        gC = cute.local_tile(mC, tiler=tile, coord=(bidx, bidy, None), proj=(1, 1, None))

        # Shared memory: one (BM, BK) tile of A and one (BN, BK) of B, both laid out by s_layout.
        smem = SmemAllocator()  # the launch's dynamic shared memory is what it hands out
        sA = smem.allocate_tensor(mA.element_type, s_layout, 16)
        sB = smem.allocate_tensor(mB.element_type, s_layout, 16)

        # The tiled copy, sliced for this thread: which elements of a tile it moves (source and destination views).
        # tAgA (CPY, CPY_M, CPY_K, k) and tAsA (CPY, CPY_M, CPY_K): CPY is one 16-byte vector.
        thr_copy = tiled_copy.get_slice(tidx)
        tAgA, tAsA = thr_copy.partition_S(gA), thr_copy.partition_D(sA)
        tBgB, tBsB = thr_copy.partition_S(gB), thr_copy.partition_D(sB)

        # The tiled MMA, sliced for this thread: the values of A, B and C it holds for the tensor-core instructions.
        # tCsA (MMA, MMA_M, MMA_K) views shared memory; tCrA, tCrB, tCrC are register fragments of the same shapes.
        thr_mma = tiled_mma.get_slice(tidx)
        tCsA, tCsB, tCgC = thr_mma.partition_A(sA), thr_mma.partition_B(sB), thr_mma.partition_C(gC)
        tCrA, tCrB = tiled_mma.make_fragment_A(tCsA), tiled_mma.make_fragment_B(tCsB)
        tCrC = tiled_mma.make_fragment_C(tCgC)
        tCrC.fill(0.0)

        # The tile loop over K: copy a step's tiles in, wait for every thread's copy, multiply, wait again before
        # the next step overwrites shared memory.
        for k_tile in range(cute.size(gA, mode=[2])):
            cute.copy(tiled_copy, tAgA[None, None, None, k_tile], tAsA)  # cp.async, global -> shared
            cute.copy(tiled_copy, tBgB[None, None, None, k_tile], tBsB)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
            cute.arch.sync_threads()
            cute.autovec_copy(tCsA, tCrA)  # shared -> registers, in the MMA's thread-value layout
            cute.autovec_copy(tCsB, tCrB)
            cute.gemm(tiled_mma, tCrC, tCrA, tCrB, tCrC)  # tCrC += tCrA · tCrBᵀ over the step's MMA_K blocks
            cute.arch.sync_threads()

        # Epilogue: round the float32 accumulators to C's dtype and store them from registers to global memory.
        tCrD = cute.make_fragment_like(tCrC, mC.element_type)
        tCrD.store(tCrC.load().to(mC.element_type))
        cute.copy(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mC.element_type), tCrD, tCgC)

    @cute.jit
    def gemm_host(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor):
        dtype = mA.element_type
        # A layout: the shared-memory tile, K-major (rows of BK elements, PAD more between rows).
        s_layout = cute.make_layout((BM, BK), stride=(BK + PAD, 1))

        # A copy atom (one cp.async of 128 bits = 8 elements) tiled over the threads: a thread layout
        # (32, 4):(4, 1) puts 4 threads along a row of BK = 32 elements and 32 rows, each thread taking a
        # (1, 8) vector; one pass of the 128 threads moves a 32 × 32 block, repeated over the tile.
        copy_atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(), dtype, num_bits_per_copy=128)
        tiled_copy = cute.make_tiled_copy_tv(copy_atom, cute.make_layout((32, 4), stride=(4, 1)),
                                             cute.make_layout((1, 8)))

        # An MMA atom: one warp's mma.sync m16n8k16 (SM80, runs on Hopper too), bf16/fp16 in, float32 out;
        # tiled 2 × 2 × 1 over the 4 warps, so one step of the tiled MMA covers 32 × 16 of C and 16 of K.
        mma_atom = cute.nvgpu.warp.MmaF16BF16Op(dtype, cutlass.Float32, (16, 8, 16))
        tiled_mma = cute.make_tiled_mma(mma_atom, (2, 2, 1))

        grid = [cute.size(mC, mode=[0]) // BM, cute.size(mC, mode=[1]) // BN, 1]
        gemm_kernel(mA, mB, mC, s_layout, tiled_copy, tiled_mma).launch(grid=grid, block=[THREADS, 1, 1])


_cute_compiled = {}  # (dtype, padded M, N, K) -> compiled kernel: from_dlpack gives static layouts, one build per shape


def _cute_padded(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """x with zero rows and columns added up to multiples of (rows, cols), contiguous (zeros add nothing to A·Bᵀ)."""
    pad_rows, pad_cols = -x.shape[0] % rows, -x.shape[1] % cols
    return torch.nn.functional.pad(x, (0, pad_cols, 0, pad_rows)).contiguous()


def cute_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A·Bᵀ for a (M, K) and b (N, K) on the GPU, both bf16 or both fp16; the result (M, N) in their dtype,
    accumulated in float32."""
    if not CUTE_AVAILABLE:
        raise RuntimeError(CUTE_REASON)
    if a.dtype != b.dtype or a.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"cute_gemm takes two bf16 or two fp16 matrices, got {a.dtype} and {b.dtype}")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or not a.is_cuda:
        raise ValueError(f"cute_gemm takes CUDA matrices a (M, K) and b (N, K), got {tuple(a.shape)} and "
                         f"{tuple(b.shape)} on {a.device}")
    m, n = a.shape[0], b.shape[0]
    a_tiles, b_tiles = _cute_padded(a, BM, BK), _cute_padded(b, BN, BK)
    c_tiles = torch.empty(a_tiles.shape[0], b_tiles.shape[0], dtype=a.dtype, device=a.device)
    args = [from_dlpack(t, assumed_align=16) for t in (a_tiles, b_tiles, c_tiles)]
    key = (a.dtype, *c_tiles.shape, a_tiles.shape[1])
    if key not in _cute_compiled:
        _cute_compiled[key] = cute.compile(gemm_host, *args)
    _cute_compiled[key](*args)
    return c_tiles[:m, :n]
