"""Week 35 — attention building blocks: reference solutions of every graded exercise.

Each part a learner writes sits between BEGIN SOLUTION / END SOLUTION markers; the stubs in
course/exercises/w35_attention_blocks.py are generated from this file (`python -m course stubs`).
Tensors are (batch, heads, length, head_dim) with any strides; kernels compute in float32 and store
in the input's dtype. The mask conventions (causal top-left, key padding, ALiBi, fully masked rows
give zeros) are the ones of course/w35_attention_blocks/reference.py.
"""
import math

import numpy as np
import torch
import triton
import triton.language as tl

from course.backend import ON_GPU
from course.cuda import CudaKernel
from course.heads import as_heads, key_lengths_tensor, out_tensor, rows_at_one_stride, slopes_tensor

MAX_KEYS = 32768  # the fused softmax holds a whole score row in registers


# ---------------------------------------------------------------- day 1: NumPy
def attention_scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Scaled scores q kᵀ / sqrt(d) of (B, H, M, d) queries and (B, H, N, d) keys: (B, H, M, N)."""
    ### BEGIN SOLUTION
    return (q @ np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])
    ### END SOLUTION


# ---------------------------------------------------------------- day 2: QKᵀ as a tiled GEMM in CUDA C
TILE = 32  # the launch below and TILE in the source must agree

TILED_MATMUL_SRC = r"""
// C[z] = A[z] · B[z]ᵀ for every head z = b·H + h: A is M×K, B is N×K (rows at any stride), C is a
// contiguous M×N block. One TILE×TILE block of threads per TILE×TILE tile of C, one output per thread.
// The K axis is walked TILE columns at a time through shared memory, so each element of A and B is
// read from global memory once per tile of C that needs it instead of once per output.
constexpr int TILE = 32;

template <typename T>
__global__ void tiled_matmul(const T* a, const T* b, T* c, int M, int N, int K, int H,
                             int a_sb, int a_sh, int a_sm, int b_sb, int b_sh, int b_sn) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE + 1];  // +1: threads of a warp read a column of Bs from 32 banks
    const int z = blockIdx.z, tx = threadIdx.x, ty = threadIdx.y;
    const T* A = a + (size_t)(z / H) * a_sb + (size_t)(z % H) * a_sh;
    const T* B = b + (size_t)(z / H) * b_sb + (size_t)(z % H) * b_sh;
    const int row = blockIdx.y * TILE + ty;    // row of C and of A
    const int col = blockIdx.x * TILE + tx;    // column of C, row of B
    const int b_row = blockIdx.x * TILE + ty;  // the row of B this thread loads
    float acc = 0.f;
    // BEGIN SOLUTION
    for (int k0 = 0; k0 < K; k0 += TILE) {
        As[ty][tx] = (row < M && k0 + tx < K) ? to_float(A[(size_t)row * a_sm + k0 + tx]) : 0.f;
        Bs[ty][tx] = (b_row < N && k0 + tx < K) ? to_float(B[(size_t)b_row * b_sn + k0 + tx]) : 0.f;
        __syncthreads();
        for (int kk = 0; kk < TILE; ++kk) acc += As[ty][kk] * Bs[tx][kk];
        __syncthreads();  // every thread is done with this tile before the next one overwrites it
    }
    // END SOLUTION
    if (row < M && col < N) c[(size_t)z * M * N + (size_t)row * N + col] = from_float<T>(acc);
}
"""
tiled_matmul_kernel = CudaKernel(TILED_MATMUL_SRC, "tiled_matmul")


def _check_pair(op: str, a: torch.Tensor, b: torch.Tensor, same_length: bool = False):
    if a.shape[:2] != b.shape[:2] or a.shape[-1] != b.shape[-1] or (same_length and a.shape[2] != b.shape[2]) \
            or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} ({a.dtype}, {b.dtype}) do not "
                         f"match: same batch, heads, head_dim, dtype and device needed")


def tiled_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """a · bᵀ per head with the tiled shared-memory CUDA C kernel: a (B, H, M, K), b (B, H, N, K)."""
    a, b = as_heads(a, "tiled_matmul", "a"), as_heads(b, "tiled_matmul", "b")
    _check_pair("tiled_matmul", a, b)
    (bsz, heads, m, k), n = a.shape, b.shape[2]
    out = out_tensor(out, (bsz, heads, m, n), a, "tiled_matmul")
    tiled_matmul_kernel((triton.cdiv(n, TILE), triton.cdiv(m, TILE), bsz * heads), (TILE, TILE),
                        a, b, out, m, n, k, heads, *a.stride()[:3], *b.stride()[:3])
    return out


# ---------------------------------------------------------------- day 2: QKᵀ in Triton
def _precision(x: torch.Tensor) -> str:
    """fp32 inputs: exact float32 products ("ieee"), not TF32; 16-bit inputs use tensor cores anyway."""
    return "ieee" if x.dtype == torch.float32 else "tf32"


def _block_d(d: int) -> int:
    if d > 256:
        raise ValueError(f"head_dim {d} is larger than the kernels' 256")
    return max(16, triton.next_power_of_2(d))


@triton.jit
def qk_scores_kernel(q_ptr, k_ptr, s_ptr, M, N, D, H, scale, sqb, sqh, sqm, skb, skh, skn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, TILES: tl.constexpr,
                     STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # Program (n-group, m-block, b·H + h) computes TILES neighbouring BLOCK_M × BLOCK_N tiles of
    # S = scale · Q Kᵀ of one head, each with one tl.dot over the whole head dimension. The Q tile is
    # loaded once; the loop is pipelined, so the next K tile is on its way while this tile is stored.
    # Reads BLOCK_M·d + TILES·BLOCK_N·d, writes TILES tiles.
    pid_n, pid_m, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    s_rows = s_ptr + bh.to(tl.int64) * M * N + rows[:, None] * N
    ### BEGIN SOLUTION
    q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :],
                mask=(rows[:, None] < M) & (dims[None, :] < D), other=0.0)
    for t in tl.range(0, TILES, num_stages=STAGES):
        cols = (pid_n * TILES + t) * BLOCK_N + tl.arange(0, BLOCK_N)
        k_t = tl.load(k_ptr + b * skb + h * skh + cols[None, :] * skn + dims[:, None],
                      mask=(cols[None, :] < N) & (dims[:, None] < D), other=0.0)
        s = tl.dot(q, k_t, input_precision=PRECISION) * scale
        tl.store(s_rows + cols[None, :], s.to(s_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))
    ### END SOLUTION


# (BLOCK_M, BLOCK_N, TILES, STAGES, num_warps): the GPU tiles from a sweep on an H200 (tune_qk in
# course/w35_attention_blocks/bench.py); on CPU small tiles, so the graders' small heads still run several blocks,
# partial blocks and the loops.
QK_TILE = (128, 64, 16, 3, 8) if ON_GPU else (32, 32, 2, 1, 4)


def qk_scores(q: torch.Tensor, k: torch.Tensor, out: torch.Tensor | None = None, scale: float = 1.0):
    """scale · q kᵀ per head (Triton): q (B, H, M, d), k (B, H, N, d) -> (B, H, M, N) in q's dtype, or
    in float32 when `out` is a float32 tensor (the scores keep the accumulator's precision)."""
    q, k = as_heads(q, "qk_scores", "q"), as_heads(k, "qk_scores", "k")
    _check_pair("qk_scores", q, k)
    (bsz, heads, m, d), n = q.shape, k.shape[2]
    out = out_tensor(out, (bsz, heads, m, n), q, "qk_scores", dtypes=(torch.float32,))
    block_m, block_n, tiles, stages, warps = QK_TILE
    grid = (triton.cdiv(n, block_n * tiles), triton.cdiv(m, block_m), bsz * heads)
    qk_scores_kernel[grid](q, k, out, m, n, d, heads, float(scale), *q.stride()[:3], *k.stride()[:3],
                           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=_block_d(d), TILES=tiles, STAGES=stages,
                           PRECISION=_precision(q), num_warps=warps)
    return out


# ---------------------------------------------------------------- day 3: masks in NumPy
def apply_masks(scores: np.ndarray, key_lengths=None, causal: bool = False, alibi_slopes=None) -> np.ndarray:
    """Scores (B, H, M, N) plus the ALiBi bias -slope_h·|i - j|, then -inf where a key is masked:
    causal (query i sees keys j <= i) and key padding (keys j >= key_lengths[b] of batch b)."""
    b, h, m, n = scores.shape
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    ### BEGIN SOLUTION
    biased = scores
    if alibi_slopes is not None:
        biased = scores - np.asarray(alibi_slopes, scores.dtype).reshape(1, h, 1, 1) * np.abs(i - j)
    keep = np.ones((b, 1, m, n), dtype=bool)
    if causal:
        keep &= j <= i
    if key_lengths is not None:
        keep &= j < np.asarray(key_lengths).reshape(b, 1, 1, 1)
    return np.where(keep, biased, -np.inf).astype(scores.dtype)
    ### END SOLUTION


# ---------------------------------------------------------------- day 4: fused scale + mask + softmax
@triton.jit
def masked_row_softmax(s_row, cols, end, N, i, scale, slope, HAS_ALIBI: tl.constexpr):
    # Probabilities (float32) over the keys `cols` of one score row at s_row, query i: x = scale·s
    # (minus slope·|i - j| with ALiBi), keys j < end kept, the rest 0; a row with no kept key is all 0.
    # Reads the kept keys rounded up to 16; the caller stores the result.
    ### BEGIN SOLUTION
    # Load up to `end` rounded up to 16 keys: a mask that is constant over groups of 16 lets the
    # compiler keep 16-byte loads (the extra keys are masked below).
    loaded = cols < tl.minimum(tl.cdiv(end, 16) * 16, N)
    s = tl.load(s_row + cols, mask=loaded, other=0.0).to(tl.float32)
    x = s * scale
    if HAS_ALIBI:
        x = x - slope * tl.abs(i - cols).to(tl.float32)
    x = tl.where(cols < end, x, -float("inf"))
    top = tl.max(x, axis=0)
    top = tl.where(top == -float("inf"), 0.0, top)  # a fully masked row: exp(-inf - 0) = 0, not exp(NaN)
    e = tl.exp(x - top)  # masked keys: exp(-inf) = 0
    total = tl.sum(e, axis=0)
    p = e * (1.0 / tl.where(total > 0, total, 1.0))  # one division per row, a multiply per key
    ### END SOLUTION
    return p


@triton.jit
def scale_mask_softmax_kernel(s_ptr, p_ptr, len_ptr, slope_ptr, M, N, H, scale, ssb, ssh, ssm, p_row_stride,
                              BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_LENGTHS: tl.constexpr,
                              HAS_ALIBI: tl.constexpr):
    # One program per score row (b, h, i). The kept keys are a prefix j < end of the row (causal and
    # padding both cut it): only they are read (rounded up to 16), and all N probabilities are written,
    # at rows of P that lie p_row_stride apart (P may overwrite S in place, also when it is narrower).
    row = tl.program_id(0)
    i = row % M
    b, h = row // M // H, row // M % H
    s_row = s_ptr + b.to(tl.int64) * ssb + h.to(tl.int64) * ssh + i.to(tl.int64) * ssm  # > 2^31 elements
    p_row = p_ptr + row.to(tl.int64) * p_row_stride
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(slope_ptr + h)
    ### BEGIN SOLUTION
    end = N
    if CAUSAL:
        end = tl.minimum(end, i + 1)
    if HAS_LENGTHS:
        end = tl.minimum(end, tl.load(len_ptr + b))
    ### END SOLUTION
    # The kernel is bound by arithmetic per key, and a masked key costs as much as a kept one. So a
    # row whose kept keys fit in the first half of the block (half the rows of a causal mask) works
    # on that half only and stores zeros after it (BLOCK_N >= 32).
    half = tl.arange(0, BLOCK_N // 2)
    if end <= BLOCK_N // 2:
        p_half = masked_row_softmax(s_row, half, end, N, i, scale, slope, HAS_ALIBI)
        tl.store(p_row + half, p_half.to(p_ptr.dtype.element_ty), mask=half < N)
        tl.store(p_row + BLOCK_N // 2 + half, tl.zeros_like(p_half).to(p_ptr.dtype.element_ty),
                 mask=BLOCK_N // 2 + half < N)
    else:
        cols = tl.arange(0, BLOCK_N)
        p = masked_row_softmax(s_row, cols, end, N, i, scale, slope, HAS_ALIBI)
        tl.store(p_row + cols, p.to(p_ptr.dtype.element_ty), mask=cols < N)


def _mask_args(op, scores, key_lengths, alibi_slopes):
    lengths = key_lengths_tensor(key_lengths, scores.shape[0], scores, op)
    slopes = slopes_tensor(alibi_slopes, scores.shape[1], scores, op)
    return lengths, slopes


def scale_mask_softmax(scores: torch.Tensor, out: torch.Tensor | None = None, scale: float = 1.0,
                       key_lengths=None, causal: bool = False, alibi_slopes=None) -> torch.Tensor:
    """softmax(mask(scale · scores - slope·|i - j|)) over the last dimension (Triton). Rows whose keys are
    all masked come out as zeros. `out` may share the scores' memory: `scores` itself, or, for float32
    scores, a 16-bit view of the front of each row (`scores.view(torch.bfloat16)[..., :N]`): each program
    has read its whole row before it writes."""
    scores = as_heads(scores, "scale_mask_softmax", "scores")
    bsz, heads, m, n = scores.shape
    if n > MAX_KEYS:
        raise ValueError(f"scale_mask_softmax: rows of {n} keys do not fit one block (at most {MAX_KEYS})")
    out = out_tensor(out, scores.shape, scores, "scale_mask_softmax", dtypes=(torch.float16, torch.bfloat16),
                     rows=True)
    lengths, slopes = _mask_args("scale_mask_softmax", scores, key_lengths, alibi_slopes)
    block = max(32, triton.next_power_of_2(n))
    # about 2 KB of scores per warp, 2 to 16 warps (course/w35_attention_blocks/bench.py tune_softmax, H200: more
    # warps per row lose)
    warps = max(2, min(16, triton.next_power_of_2(block * scores.element_size() // 2048)))
    scale_mask_softmax_kernel[(bsz * heads * m,)](
        scores, out, lengths if lengths is not None else scores, slopes if slopes is not None else scores,
        m, n, heads, float(scale), *scores.stride()[:3], out.stride(2), BLOCK_N=block, CAUSAL=bool(causal),
        HAS_LENGTHS=lengths is not None, HAS_ALIBI=slopes is not None, num_warps=warps)
    return out


SOFTMAX_THREADS = 256  # the launch below and THREADS in the source must agree

CUDA_SCALE_MASK_SOFTMAX_SRC = r"""
// One block of THREADS threads per score row (b, h, i): p = softmax(mask(scale · s - slope·|i - j|)).
// The kept keys are the prefix j < end. Reads the kept scores three times (max, sum, write pass; the
// later passes are meant to hit L1/L2) and writes all N probabilities.
constexpr int THREADS = 256;

__device__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

__device__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Every thread gets the block's max (IS_MAX) or sum of v.
template <bool IS_MAX>
__device__ float block_reduce(float v, float* smem) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = lane < THREADS / 32 ? smem[lane] : (IS_MAX ? -INFINITY : 0.f);
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    return v;
}

template <typename T>
__global__ void cuda_scale_mask_softmax(const T* s, T* p, const int* key_lengths, const float* slopes,
                                        int M, int N, int H, float scale, int s_sb, int s_sh, int s_sm,
                                        int causal, int has_lengths, int has_alibi) {
    __shared__ float smem[32];
    const int i = blockIdx.x % M, bh = blockIdx.x / M, b = bh / H, h = bh % H;
    const T* srow = s + (size_t)b * s_sb + (size_t)h * s_sh + (size_t)i * s_sm;
    T* prow = p + (size_t)blockIdx.x * N;
    const float slope = has_alibi ? slopes[h] : 0.f;
    // BEGIN SOLUTION
    int end = N;
    if (causal) end = min(end, i + 1);
    if (has_lengths) end = min(end, key_lengths[b]);
    float m = -INFINITY;
    for (int j = threadIdx.x; j < end; j += THREADS)
        m = fmaxf(m, scale * to_float(srow[j]) - slope * fabsf((float)(i - j)));
    m = block_reduce<true>(m, smem);
    float total = 0.f;
    for (int j = threadIdx.x; j < end; j += THREADS)
        total += __expf(scale * to_float(srow[j]) - slope * fabsf((float)(i - j)) - m);
    total = block_reduce<false>(total, smem);
    const float inv = total > 0.f ? 1.f / total : 0.f;  // a fully masked row (end = 0) stays zeros
    for (int j = threadIdx.x; j < N; j += THREADS)
        prow[j] = from_float<T>(j < end ? __expf(scale * to_float(srow[j]) - slope * fabsf((float)(i - j)) - m) * inv
                                        : 0.f);
    // END SOLUTION
}
"""
cuda_scale_mask_softmax_kernel = CudaKernel(CUDA_SCALE_MASK_SOFTMAX_SRC, "cuda_scale_mask_softmax")


def cuda_scale_mask_softmax(scores: torch.Tensor, out: torch.Tensor | None = None, scale: float = 1.0,
                            key_lengths=None, causal: bool = False, alibi_slopes=None) -> torch.Tensor:
    """scale_mask_softmax with the block-per-row CUDA C kernel (same arguments and conventions)."""
    scores = as_heads(scores, "cuda_scale_mask_softmax", "scores")
    bsz, heads, m, n = scores.shape
    out = out_tensor(out, scores.shape, scores, "cuda_scale_mask_softmax")
    lengths, slopes = _mask_args("cuda_scale_mask_softmax", scores, key_lengths, alibi_slopes)
    dummy = torch.empty(1, dtype=torch.int32, device=scores.device)
    cuda_scale_mask_softmax_kernel((bsz * heads * m,), (SOFTMAX_THREADS,), scores, out,
                                   lengths if lengths is not None else dummy,
                                   slopes if slopes is not None else dummy.float(), m, n, heads, float(scale),
                                   *scores.stride()[:3], int(bool(causal)), int(lengths is not None),
                                   int(slopes is not None))
    return out


# ---------------------------------------------------------------- day 5: PV and the composed attention
@triton.jit
def pv_kernel(p_ptr, v_ptr, o_ptr, M, N, D, H, p_row_stride, svb, svh, svn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    # Program (m-block, b·H + h): the BLOCK_M × d tile of O = P V of one head, accumulated in float32
    # over key blocks. P's rows (b, h, i) lie p_row_stride apart. With CAUSAL, P is zero right of the diagonal, so
    # key blocks past the tile's last row are never loaded. Reads BLOCK_M·N of P and N·d of V.
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    p_rows = p_ptr + (bh.to(tl.int64) * M + rows[:, None]) * p_row_stride
    v_head = v_ptr + b * svb + h * svh
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    ### BEGIN SOLUTION
    end = N
    if CAUSAL:
        end = tl.minimum(N, (pid_m + 1) * BLOCK_M)
    for start in tl.range(0, end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        p = tl.load(p_rows + keys[None, :], mask=(rows[:, None] < M) & (keys[None, :] < N), other=0.0)
        v = tl.load(v_head + keys[:, None] * svn + dims[None, :], mask=(keys[:, None] < N) & (dims[None, :] < D),
                    other=0.0)
        acc += tl.dot(p, v, input_precision=PRECISION)
    ### END SOLUTION
    o = o_ptr + bh.to(tl.int64) * M * D + rows[:, None] * D + dims[None, :]
    tl.store(o, acc.to(o_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (dims[None, :] < D))


# (BLOCK_M, BLOCK_N, num_warps, num_stages) on the GPU (swept on an H200: tune_pv in
# course/w35_attention_blocks/bench.py); small on CPU, so the graders' small heads still run several key blocks and
# the causal skip.
PV_TILE = (128, 64, 8, 3) if ON_GPU else (32, 32, 4, 1)


def pv(p: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
    """O = P V per head (Triton): p (B, H, M, N) probabilities, contiguous or rows at one stride (see
    scale_mask_softmax), v (B, H, N, d) any strides. causal=True promises P is zero right of the
    diagonal (j > i), so those key blocks are skipped."""
    v = as_heads(v, "pv", "v")
    if not (isinstance(p, torch.Tensor) and p.dim() == 4 and p.shape[:2] == v.shape[:2]
            and p.shape[3] == v.shape[2] and p.dtype == v.dtype and rows_at_one_stride(p)):
        raise ValueError(f"pv: p must be a (B, H, M, N) tensor with contiguous rows at one stride, matching v {tuple(v.shape)} {v.dtype}; "
                         f"got {tuple(getattr(p, 'shape', ()))} {getattr(p, 'dtype', type(p).__name__)}")
    bsz, heads, m, n = p.shape
    d = v.shape[3]
    out = out_tensor(out, (bsz, heads, m, d), v, "pv")
    block_m, block_n, warps, stages = PV_TILE
    pv_kernel[(triton.cdiv(m, block_m), bsz * heads)](
        p, v, out, m, n, d, heads, p.stride(2), *v.stride()[:3], BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=_block_d(d),
        CAUSAL=bool(causal), PRECISION=_precision(v), num_warps=warps, num_stages=stages)
    return out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None = None,
              key_lengths=None, causal: bool = False, alibi_slopes=None, scale: float | None = None):
    """softmax(mask(scale · q kᵀ - slope·|i - j|)) v from three kernels: qk_scores, scale_mask_softmax,
    pv. The scores are kept in float32 (16-bit scores would round every logit, and with it every
    probability) and the probabilities, in q's dtype, overwrite them in place: one float32 (B, H, M, N)
    buffer is all the extra memory. scale defaults to 1/sqrt(d)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    _check_pair("attention", k, v, same_length=True)
    ### BEGIN SOLUTION
    scores = qk_scores(q, k, out=torch.empty((*q.shape[:3], k.shape[2]), dtype=torch.float32, device=q.device))
    probs = scores if q.dtype == torch.float32 else scores.view(q.dtype)[..., :k.shape[2]]
    probs = scale_mask_softmax(scores, out=probs, scale=scale, key_lengths=key_lengths, causal=causal,
                               alibi_slopes=alibi_slopes)
    return pv(probs, v, out=out, causal=causal)
    ### END SOLUTION


# ---------------------------------------------------------------- day 6: RoPE and the fused QKV projection
@triton.jit
def rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, N, H, HALF, sxb, sxh, sxn, BLOCK_N: tl.constexpr,
                BLOCK_HALF: tl.constexpr):
    # Program (n-block, b·H + h) rotates BLOCK_N positions of one head: the pair (x_c, x_{c+d/2}) of
    # position t turns by the angle t·θ_c. Reads x once and the tables (N × d/2, shared by all heads,
    # from L2), writes y once.
    pid_n, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    pos = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c = tl.arange(0, BLOCK_HALF)
    mask = (pos[:, None] < N) & (c[None, :] < HALF)
    x_row = x_ptr + b * sxb + h * sxh + pos[:, None] * sxn
    y_row = y_ptr + bh.to(tl.int64) * N * 2 * HALF + pos[:, None] * 2 * HALF
    table = pos[:, None] * HALF + c[None, :]
    ### BEGIN SOLUTION
    x1 = tl.load(x_row + c[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + HALF + c[None, :], mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + table, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + table, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_row + c[None, :], (x1 * cos - x2 * sin).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_row + HALF + c[None, :], (x2 * cos + x1 * sin).to(y_ptr.dtype.element_ty), mask=mask)
    ### END SOLUTION


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary embedding of x (B, H, N, d), "rotate half" layout: cos and sin are (N, d/2) tables
    (course.w35_attention_blocks.reference.rope_tables), in any float dtype."""
    x = as_heads(x, "rope", "x")
    bsz, heads, n, d = x.shape
    if d % 2 or cos.shape != (n, d // 2) or sin.shape != (n, d // 2):
        raise ValueError(f"rope: need an even head_dim and cos, sin of shape {(n, d // 2)}; got d = {d}, "
                         f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    out = out_tensor(out, x.shape, x, "rope")
    block_n = 64 if ON_GPU else 32
    rope_kernel[(triton.cdiv(n, block_n), bsz * heads)](
        x, cos.contiguous(), sin.contiguous(), out, n, heads, d // 2, *x.stride()[:3], BLOCK_N=block_n,
        BLOCK_HALF=triton.next_power_of_2(d // 2), num_warps=4)
    return out


def qkv_projection(x: torch.Tensor, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None, n_heads: int):
    """q, k, v of multi-head attention from one GEMM: x (B, N, C) times the stacked weights w_qkv
    (3C, C) gives (B, N, 3, H, d), seen as three (B, H, N, d) views with no copy (strided, not
    contiguous: the kernels above take strides for this reason)."""
    bsz, n, c = x.shape
    if w_qkv.shape != (3 * c, c) or c % n_heads:
        raise ValueError(f"qkv_projection: need w_qkv of shape {(3 * c, c)} and C = {c} divisible by "
                         f"n_heads = {n_heads}; got {tuple(w_qkv.shape)}")
    qkv = torch.nn.functional.linear(x, w_qkv, b_qkv).view(bsz, n, 3, n_heads, c // n_heads)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    return q, k, v
