"""Your exercises. Generated from solutions/w37_flash_attention_core.py by `python -m course stubs`.

Replace every `YOUR CODE HERE` line with your code, then run the grading cell in the notebook
(or `python -m course grade w37.<exercise>`). The reference solutions are in solutions/w37_flash_attention_core.py:
try first, peek later.
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
    # YOUR CODE HERE
    return reads, writes


# ---------------------------------------------------------------- day 2: the online tile update, in NumPy
def online_update(m, l, o, s, v):
    """One key tile of the online softmax for a block of Br queries: running max m (Br,), running sum l (Br,)
    and normalised output o (Br, d) so far; s (Br, Bc) the tile's scaled scores (-inf where masked) and
    v (Bc, d) its values. Returns the updated (m, l, o). A row that has seen no key yet keeps m = -inf,
    l = 0, o = 0."""
    # YOUR CODE HERE
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
    # YOUR CODE HERE
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
        // YOUR CODE HERE
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
    # YOUR CODE HERE
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
    # YOUR CODE HERE
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
    # YOUR CODE HERE
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
    # YOUR CODE HERE
    return free, stop
