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
from course.cuda import CudaKernel
from course.heads import as_heads

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e); a constexpr, so kernels read it (the host: LOG2E.value)


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


# ---------------------------------------------------------------- shared by the two forwards below
def _heads_and_scale(op: str, q, k, v, scale, max_d: int):
    """q, k, v as (B, H, length, d) tensors with a contiguous last dimension, checked against each other, and
    the softmax scale (1/sqrt(d) by default)."""
    q, k, v = (as_heads(t, op, name) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    (bsz, heads, _, d), n = q.shape, k.shape[2]
    if k.shape != (bsz, heads, n, d) or v.shape != k.shape or not q.dtype == k.dtype == v.dtype \
            or not q.device == k.device == v.device:
        raise ValueError(f"{op}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} must share batch, "
                         f"heads, head_dim, dtype and device; k and v must have the same shape")
    if d > max_d:
        raise ValueError(f"{op}: head_dim {d} is larger than the kernel's {max_d}")
    return q, k, v, 1 / math.sqrt(d) if scale is None else float(scale)


# ---------------------------------------------------------------- day 3: the CUDA C forward (CuPy RawKernel)
BR, BC, FLASH_THREADS, CUDA_MAX_D = 64, 64, 256, 128  # the launch below and the constants in the source must agree

CUDA_FLASH_ATTENTION_SRC = r"""
// FlashAttention forward in float32 arithmetic (storage T: float, half or bf16). One block of 256 threads per
// (query block of BR = 64 rows, head z = b·H + h): Q's tile stays in shared memory while the key and value
// tiles of BC = 64 keys stream past it, one at a time through one buffer. Reads Q once and K, V once per
// query block (causal: only up to the diagonal); writes O and the natural-log LSE of every query row.
// Thread (ty, tx) = (tid / 16, tid % 16) owns query rows ty*4 .. ty*4+3 (a warp holds 8 whole rows), the
// scores of those rows against keys tx, tx+16, tx+32, tx+48 of each tile, and the output columns
// tx*4 .. tx*4+3 and 64 + tx*4 .. 64 + tx*4+3.
constexpr int BR = 64, BC = 64, THREADS = 256, PS = BC + 4;
constexpr float LN2 = 0.6931471805599453f;

// rows [first, first + rows) of a (n, d) matrix at row stride `stride` into shared memory at row stride dp,
// zeros past row n and past column d (the dot products then need no bounds checks)
template <typename T>
__device__ void load_tile(float* dst, const T* src, int first, int rows, int n, int d, int dp, int stride) {
    for (int i = threadIdx.x; i < rows * dp; i += THREADS) {
        const int r = i / dp, c = i - r * dp;
        dst[i] = (first + r < n && c < d) ? to_float(src[(size_t)(first + r) * stride + c]) : 0.f;
    }
}

template <typename T>
__global__ void __launch_bounds__(THREADS) cuda_flash_attention(
        const T* q, const T* k, const T* v, T* o, float* lse, int M, int N, int D, int H, float qk_scale,
        int causal, int sqb, int sqh, int sqm, int skb, int skh, int skn, int svb, int svh, int svn) {
    extern __shared__ float4 shared4[];
    // Row stride dp: a multiple of 32 floats plus 4, so 16 threads reading float4s of 16 different rows
    // spread over the 8 groups of 4 banks, 2 each: 2 passes for 256 bytes, the fewest there can be.
    const int dp = (D + 31) / 32 * 32 + 4;
    float* Qs = reinterpret_cast<float*>(shared4);  // BR × dp
    float* KVs = Qs + BR * dp;                       // BC × dp: the K tile, then the V tile
    float* Ps = KVs + BC * dp;                       // BR × PS: each warp's probabilities, for P V
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const int qb = causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // causal: the longest rows start first
    const int first = qb * BR, z = blockIdx.y, b = z / H, h = z % H;
    const T* Q = q + (size_t)b * sqb + (size_t)h * sqh;
    const T* K = k + (size_t)b * skb + (size_t)h * skh;
    const T* V = v + (size_t)b * svb + (size_t)h * svh;
    load_tile(Qs, Q, first, BR, M, D, dp, sqm);

    float m_i[4], l_i[4], acc[4][2][4];  // per row: running max (base 2), this thread's share of the sum
    for (int i = 0; i < 4; ++i) {
        m_i[i] = -INFINITY; l_i[i] = 0.f;
        for (int c = 0; c < 2; ++c) for (int e = 0; e < 4; ++e) acc[i][c][e] = 0.f;
    }
    const int stop = causal ? min(first + BR, N) : N;  // causal: no key after the block's last query
    for (int start = 0; start < stop; start += BC) {
        __syncthreads();  // everyone is done with the last V tile
        load_tile(KVs, K, start, BC, N, D, dp, skn);
        __syncthreads();
        float s[4][4] = {};  // S = Q Kᵀ for rows ty*4+i, keys start + tx + 16 j
        for (int kk = 0; kk < D; kk += 4) {
            float4 a[4], w[4];
            #pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = *reinterpret_cast<const float4*>(&Qs[(ty * 4 + i) * dp + kk]);
            for (int j = 0; j < 4; ++j) w[j] = *reinterpret_cast<const float4*>(&KVs[(tx + 16 * j) * dp + kk]);
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j)
                    s[i][j] += a[i].x * w[j].x + a[i].y * w[j].y + a[i].z * w[j].z + a[i].w * w[j].w;
        }
        __syncthreads();  // everyone is done with the K tile
        load_tile(KVs, V, start, BC, N, D, dp, svn);
        __syncthreads();
        // BEGIN SOLUTION
        for (int i = 0; i < 4; ++i) {
            const int row = first + ty * 4 + i;
            float top = -INFINITY;
            for (int j = 0; j < 4; ++j) {
                const int col = start + tx + 16 * j;
                const bool keep = col < N && (!causal || col <= row);
                s[i][j] = keep ? s[i][j] * qk_scale : -INFINITY;  // base-2 logits
                top = fmaxf(top, s[i][j]);
            }
            for (int lane = 8; lane > 0; lane >>= 1)  // the row's max over the 16 threads that hold it
                top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, lane));
            const float m_new = fmaxf(m_i[i], top);
            const float base = m_new == -INFINITY ? 0.f : m_new;  // no key yet: exp2(-inf - 0) = 0, never NaN
            const float alpha = exp2f(m_i[i] - base);
            float sum = 0.f;
            for (int j = 0; j < 4; ++j) {
                const float p = exp2f(s[i][j] - base);
                Ps[(ty * 4 + i) * PS + tx + 16 * j] = p;
                sum += p;
            }
            l_i[i] = l_i[i] * alpha + sum;
            for (int c = 0; c < 2; ++c) for (int e = 0; e < 4; ++e) acc[i][c][e] *= alpha;
            m_i[i] = m_new;
        }
        __syncwarp();  // the warp's rows of P are written (only this warp reads them)
        for (int j = 0; j < BC; j += 4) {  // O += P V, four keys at a time
            float4 p[4];
            for (int i = 0; i < 4; ++i) p[i] = *reinterpret_cast<const float4*>(&Ps[(ty * 4 + i) * PS + j]);
            for (int c = 0; c < 2; ++c) {
                const int col = c * 64 + tx * 4;
                if (col >= D) continue;
                float4 w[4];
                for (int jj = 0; jj < 4; ++jj) w[jj] = *reinterpret_cast<const float4*>(&KVs[(j + jj) * dp + col]);
                for (int i = 0; i < 4; ++i) {
                    acc[i][c][0] += p[i].x * w[0].x + p[i].y * w[1].x + p[i].z * w[2].x + p[i].w * w[3].x;
                    acc[i][c][1] += p[i].x * w[0].y + p[i].y * w[1].y + p[i].z * w[2].y + p[i].w * w[3].y;
                    acc[i][c][2] += p[i].x * w[0].z + p[i].y * w[1].z + p[i].z * w[2].z + p[i].w * w[3].z;
                    acc[i][c][3] += p[i].x * w[0].w + p[i].y * w[1].w + p[i].z * w[2].w + p[i].w * w[3].w;
                }
            }
        }
        // END SOLUTION
    }
    for (int i = 0; i < 4; ++i) {
        float l = l_i[i];
        for (int lane = 8; lane > 0; lane >>= 1) l += __shfl_xor_sync(0xffffffffu, l, lane);
        const int row = first + ty * 4 + i;
        if (row >= M) continue;
        const float inv = l > 0.f ? 1.f / l : 0.f;  // a row with no key at all writes zeros
        T* out = o + ((size_t)z * M + row) * D;
        for (int c = 0; c < 2; ++c)
            for (int e = 0; e < 4; ++e) {
                const int col = c * 64 + tx * 4 + e;
                if (col < D) out[col] = from_float<T>(acc[i][c][e] * inv);
            }
        if (tx == 0) lse[(size_t)z * M + row] = l > 0.f ? (m_i[i] + log2f(l)) * LN2 : -INFINITY;
    }
}
"""
cuda_flash_attention_kernel = CudaKernel(CUDA_FLASH_ATTENTION_SRC, "cuda_flash_attention")


def cuda_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale=None):
    """The CUDA C forward: (o, lse) like flash_attention, computed in float32 for any storage dtype, head_dim
    up to 128."""
    q, k, v, scale = _heads_and_scale("cuda_flash_attention", q, k, v, scale, CUDA_MAX_D)
    (bsz, heads, m, d), n = q.shape, k.shape[2]
    o = torch.empty((bsz, heads, m, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((bsz, heads, m), dtype=torch.float32, device=q.device)
    row_floats = (d + 31) // 32 * 32 + 4  # dp in the source
    shared = 4 * (BR * row_floats + BC * row_floats + BR * (BC + 4))
    cuda_flash_attention_kernel((triton.cdiv(m, BR), bsz * heads), (FLASH_THREADS,), q, k, v, o, lse, m, n, d, heads,
                                scale * LOG2E.value, int(bool(causal)), *q.stride()[:3], *k.stride()[:3],
                                *v.stride()[:3], shared_bytes=shared)
    return o, lse


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
    lse = tl.where(l_i > 0, (m_i + tl.log2(l_safe)) / LOG2E, -float("inf"))  # natural log
    ### END SOLUTION
    o_rows = o_ptr + bh.to(tl.int64) * M * D + rows[:, None] * D + dims[None, :]
    tl.store(o_rows, o.to(o_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (dims[None, :] < D))
    tl.store(lse_ptr + bh.to(tl.int64) * M + rows, lse, mask=rows < M)


# (BLOCK_M, BLOCK_N, num_warps, STAGES) per head dimension on a GPU (swept on an H200: tune_tiles in
# course/w37_flash_attention_core/bench.py); small tiles on CPU
GPU_TILES = {64: (128, 64, 8, 3), 128: (128, 64, 8, 3)}
CPU_TILES = (32, 16, 4, 1)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale=None,
                    tiles=None):
    """softmax(scale · q kᵀ, causal or not) v without the (M, N) matrix: (o, lse), o (B, H, M, d) in q's dtype,
    lse (B, H, M) float32, the natural log of each row's sum of exp(scale · q·k)."""
    q, k, v, scale = _heads_and_scale("flash_attention", q, k, v, scale, 256)
    (bsz, heads, m, d), n = q.shape, k.shape[2]
    block_d = max(16, triton.next_power_of_2(d))
    block_m, block_n, warps, stages = tiles or (GPU_TILES.get(block_d, (64, 64, 4, 2)) if ON_GPU else CPU_TILES)
    o = torch.empty((bsz, heads, m, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((bsz, heads, m), dtype=torch.float32, device=q.device)
    flash_attention_kernel[(triton.cdiv(m, block_m), bsz * heads)](
        q, k, v, o, lse, m, n, d, heads, scale * LOG2E.value, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, CAUSAL=bool(causal), STAGES=stages,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=warps)
    return o, lse


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
