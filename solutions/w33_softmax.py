"""Week 33 — softmax: reference solutions of every graded exercise.

Each part a learner writes sits between BEGIN SOLUTION / END SOLUTION markers; the stubs in
course/exercises/w33_softmax.py are generated from this file (`python -m course stubs`).
All kernels compute in float32 and store in the input's dtype.
"""
import functools

import numpy as np
import torch
import triton
import triton.language as tl

from course.backend import ON_GPU
from course.cuda import CudaKernel
from course.launch import launch
from course.rows import prepare_rows


# ---------------------------------------------------------------- day 1: NumPy
def stable_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of `x`, safe for huge logits: subtract each row's max first."""
    ### BEGIN SOLUTION
    shifted = x - x.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)
    ### END SOLUTION


# ---------------------------------------------------------------- day 2: block reduction in CUDA C
BLOCK_THREADS = 256  # the launch below and THREADS in the source must agree

BLOCK_SOFTMAX_SRC = r"""
// One block of THREADS threads per row; each thread strides over the row.
// Reads the row three times (max, sum, write pass) and writes it once.
constexpr int THREADS = 256;

struct MaxOp { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
struct SumOp { __device__ float operator()(float a, float b) const { return a + b; } };

// Combine one value per thread into one value for the whole block; every thread gets it.
template <typename Op>
__device__ float block_reduce(float v, float* smem, Op op) {
    const int tid = threadIdx.x;
    // BEGIN SOLUTION
    smem[tid] = v;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (tid < stride) smem[tid] = op(smem[tid], smem[tid + stride]);
        __syncthreads();
    }
    float result = smem[0];
    __syncthreads();  // all threads have read smem[0] before anyone reuses smem
    return result;
    // END SOLUTION
}

template <typename T>
__global__ void block_softmax(const T* x, T* y, int n_cols) {
    __shared__ float smem[THREADS];
    const T* row = x + (size_t)blockIdx.x * n_cols;
    T* out = y + (size_t)blockIdx.x * n_cols;

    float m = -INFINITY;
    for (int j = threadIdx.x; j < n_cols; j += THREADS) m = fmaxf(m, to_float(row[j]));
    m = block_reduce(m, smem, MaxOp());

    float s = 0.f;
    for (int j = threadIdx.x; j < n_cols; j += THREADS) s += __expf(to_float(row[j]) - m);
    const float inv_sum = 1.f / block_reduce(s, smem, SumOp());

    for (int j = threadIdx.x; j < n_cols; j += THREADS)
        out[j] = from_float<T>(__expf(to_float(row[j]) - m) * inv_sum);
}
"""
block_softmax_kernel = CudaKernel(BLOCK_SOFTMAX_SRC, "block_softmax")


def block_softmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Row softmax of a CUDA tensor with the block-per-row CUDA C kernel."""
    x2, out2, out, n_rows, n_cols = prepare_rows(x, out, "block_softmax")
    block_softmax_kernel((n_rows,), (BLOCK_THREADS,), x2, out2, n_cols)
    return out


# ---------------------------------------------------------------- day 3: warp shuffles, wide loads
WARP_SOFTMAX_SRC = r"""
// One block per row, blockDim.x in {32, ..., 1024} chosen by the launcher.
// Each thread loads 16-byte packs into registers (CHUNKS packs at most), so a row that fits is
// read from memory once and written once; longer rows are streamed (read twice, written once).
constexpr int CHUNKS = 4;

__device__ float warp_reduce_max(float v) {
    // BEGIN SOLUTION
    for (int offset = 16; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
    // END SOLUTION
}

__device__ float warp_reduce_sum(float v) {
    // BEGIN SOLUTION
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
    // END SOLUTION
}

// Warp-level reduce, one value per warp through shared memory, then warp 0 reduces those.
template <bool IS_MAX>
__device__ float block_reduce(float v, float* smem) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    v = IS_MAX ? warp_reduce_max(v) : warp_reduce_sum(v);
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = lane < n_warps ? smem[lane] : (IS_MAX ? -INFINITY : 0.f);
    v = IS_MAX ? warp_reduce_max(v) : warp_reduce_sum(v);
    __syncthreads();  // smem is free again
    return v;
}

template <typename T>
__global__ void warp_softmax(const T* x, T* y, int n_cols) {
    constexpr int VEC = 16 / sizeof(T);
    struct alignas(16) Pack { T v[VEC]; };
    __shared__ float smem[32];
    const T* row = x + (size_t)blockIdx.x * n_cols;
    T* out = y + (size_t)blockIdx.x * n_cols;
    const bool packed = (n_cols % VEC == 0) && ((size_t)x % 16 == 0) && ((size_t)y % 16 == 0);
    const int n_packs = (n_cols + VEC - 1) / VEC;

    if (n_packs <= CHUNKS * (int)blockDim.x) {  // the row fits in registers: one read
        float v[CHUNKS][VEC];
        float m = -INFINITY;
        #pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            const int p = c * blockDim.x + threadIdx.x;
            if (packed && p < n_packs) {
                const Pack pk = reinterpret_cast<const Pack*>(row)[p];
                #pragma unroll
                for (int k = 0; k < VEC; ++k) v[c][k] = to_float(pk.v[k]);
            } else {
                #pragma unroll
                for (int k = 0; k < VEC; ++k) v[c][k] = p * VEC + k < n_cols ? to_float(row[p * VEC + k]) : -INFINITY;
            }
            #pragma unroll
            for (int k = 0; k < VEC; ++k) m = fmaxf(m, v[c][k]);
        }
        m = block_reduce<true>(m, smem);
        float s = 0.f;
        #pragma unroll
        for (int c = 0; c < CHUNKS; ++c)
            #pragma unroll
            for (int k = 0; k < VEC; ++k) { v[c][k] = __expf(v[c][k] - m); s += v[c][k]; }
        const float inv_sum = 1.f / block_reduce<false>(s, smem);
        #pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            const int p = c * blockDim.x + threadIdx.x;
            if (packed && p < n_packs) {
                Pack pk;
                #pragma unroll
                for (int k = 0; k < VEC; ++k) pk.v[k] = from_float<T>(v[c][k] * inv_sum);
                reinterpret_cast<Pack*>(out)[p] = pk;
            } else {
                #pragma unroll
                for (int k = 0; k < VEC; ++k)
                    if (p * VEC + k < n_cols) out[p * VEC + k] = from_float<T>(v[c][k] * inv_sum);
            }
        }
        return;
    }
    // Long rows: each thread keeps a running (max, sum) over its elements (online softmax),
    // the block merges them, then a second pass writes.
    float m = -INFINITY, s = 0.f;
    for (int j = threadIdx.x; j < n_cols; j += blockDim.x) {
        const float xj = to_float(row[j]);
        if (xj > m) { s = s * __expf(m - xj) + 1.f; m = xj; }
        else if (m != -INFINITY) { s += __expf(xj - m); }  // -inf - (-inf) would be NaN
    }
    const float m_row = block_reduce<true>(m, smem);
    s = (m == -INFINITY) ? 0.f : s * __expf(m - m_row);
    const float inv_sum = 1.f / block_reduce<false>(s, smem);
    for (int j = threadIdx.x; j < n_cols; j += blockDim.x)
        out[j] = from_float<T>(__expf(to_float(row[j]) - m_row) * inv_sum);
}
"""
warp_softmax_kernel = CudaKernel(WARP_SOFTMAX_SRC, "warp_softmax")
WARP_CHUNKS = 4  # CHUNKS in the source


def warp_softmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Row softmax with warp-shuffle reductions and 16-byte loads; short rows get one warp."""
    x2, out2, out, n_rows, n_cols = prepare_rows(x, out, "warp_softmax")
    n_packs = triton.cdiv(n_cols, 16 // x.element_size())
    threads = min(1024, max(32, triton.next_power_of_2(triton.cdiv(n_packs, WARP_CHUNKS))))
    warp_softmax_kernel((n_rows,), (threads,), x2, out2, n_cols)
    return out


# ---------------------------------------------------------------- day 4: Triton, one program per row
@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    # One program per row; the whole row is one block of BLOCK >= n_cols lanes. Reads MN, writes MN.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    ### BEGIN SOLUTION
    # x stays in its storage dtype and y = exp(x - lse) recomputes the exponentials at the store,
    # instead of keeping an fp32 copy of the row live: fewer registers, more rows in flight per SM.
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    x_max = tl.max(x.to(tl.float32), axis=0)
    log_sum = tl.log(tl.sum(tl.exp(x.to(tl.float32) - x_max), axis=0))
    lse = x_max + log_sum                # rounded at the scale of x_max: off by up to 5e-4 at 1e4 ...
    lse_error = log_sum - (lse - x_max)  # ... by exactly this much, which y takes into account
    y = tl.exp(x.to(tl.float32) - lse - lse_error)
    tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    ### END SOLUTION


@functools.lru_cache(maxsize=1024)  # asked on every call: the answer per row length is worked out once
def row_block(n_cols: int) -> int:
    """The block a one-program-per-row kernel holds a row of n_cols in: the next power of two, at least 16."""
    return max(16, triton.next_power_of_2(n_cols))


@functools.lru_cache(maxsize=1024)  # asked on every call: the answer per block is worked out once
def _row_warps(block: int, element_size: int) -> int:
    """Warps per program for a row block: about 16 bytes x 4 loads in flight per thread."""
    return max(1, min(16, block * element_size // 2048))


# Register caps (launch option maxnreg) measured on an H200: 16-bit rows of 16384 columns at 16 warps
# use 58 registers (allocated as 64), two programs per SM; capped at 40, three fit (0.89 -> 0.94 of the copy ceiling).
ROW_REGISTER_CAP = {(16384, 2): 40}


def triton_softmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Row softmax with one Triton program per row (rows up to 64K columns)."""
    x2, out2, out, n_rows, n_cols = prepare_rows(x, out, "triton_softmax")
    block = row_block(n_cols)
    if block > 65536:
        raise ValueError(f"triton_softmax: rows of {n_cols} columns do not fit one block; use online_softmax")
    launch(softmax_kernel, (n_rows,), x2, out2, n_cols, BLOCK=block, num_warps=_row_warps(block, x.element_size()),
           maxnreg=ROW_REGISTER_CAP.get((block, x.element_size())))
    return out


# ---------------------------------------------------------------- day 5: online softmax
def online_softmax_update(m: np.ndarray, l: np.ndarray, chunk: np.ndarray):
    """Fold a chunk of each row into its running state (m, l): m is the max seen so far and
    l the sum of exp(x - m) over the elements seen so far. A row that has seen only -inf stays
    at the empty state (m, l) = (-inf, 0). Returns the new (m, l)."""
    ### BEGIN SOLUTION
    m_new = np.maximum(m, chunk.max(axis=-1))
    shift = np.where(np.isneginf(m_new), 0.0, m_new)  # empty rows: avoid -inf - (-inf)
    l_new = l * np.exp(m - shift) + np.exp(chunk - shift[:, None]).sum(axis=-1)
    return m_new, l_new
    ### END SOLUTION


def merge_softmax_states(m_a: np.ndarray, l_a: np.ndarray, m_b: np.ndarray, l_b: np.ndarray):
    """Merge the states of two disjoint parts of each row into the state of their union.
    The empty state (-inf, 0) is the identity. Returns (m, l)."""
    ### BEGIN SOLUTION
    m = np.maximum(m_a, m_b)
    shift = np.where(np.isneginf(m), 0.0, m)
    return m, l_a * np.exp(m_a - shift) + l_b * np.exp(m_b - shift)
    ### END SOLUTION


@triton.jit
def online_softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    # One program per row of any length, BLOCK columns at a time. A block is seen as [BLOCK // 8, 8]:
    # each group of 8 neighbouring columns (one thread's 16-byte load of bf16, two threads' in fp32) keeps
    # its own running (m, l), so the update needs no reduction across the block. Pass 1 reads the row once; pass 2
    # reads it again back to front (its tail is still in L2) and writes. tl.range(num_stages=STAGES)
    # loads the next blocks while this one is reduced. Reads 2MN (less what L2 serves), writes MN.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    y_row = y_ptr + row * n_cols
    cols = tl.arange(0, BLOCK // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]
    m = tl.full([BLOCK // 8], -1.0e38, tl.float32)  # finite: an all -inf group never computes -inf - (-inf)
    l = tl.zeros([BLOCK // 8], tl.float32)
    for start in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=-float("inf")).to(tl.float32)
        ### BEGIN SOLUTION
        m_new = tl.maximum(m, tl.max(x, axis=1))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
        ### END SOLUTION
    m_row = tl.max(m, axis=0)
    inv_sum = 1.0 / tl.sum(l * tl.exp(m - m_row), axis=0)
    n_blocks = tl.cdiv(n_cols, BLOCK)
    for i in tl.range(0, n_blocks, num_stages=STAGES):
        start = (n_blocks - 1 - i) * BLOCK
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(y_row + start + cols, (tl.exp(x - m_row) * inv_sum).to(y_ptr.dtype.element_ty), mask=mask)


def online_softmax(x: torch.Tensor, out: torch.Tensor | None = None,
                   block: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """Row softmax for rows of any length with the looped online-softmax Triton kernel, one program per row.
    `block` (columns per step) and `num_warps` tune it."""
    x2, out2, out, n_rows, n_cols = prepare_rows(x, out, "online_softmax")
    block = block or min(row_block(n_cols), 8192)  # defaults tuned on an H200
    launch(online_softmax_kernel, (n_rows,), x2, out2, n_cols, BLOCK=block, STAGES=3,
           num_warps=num_warps or max(1, min(16, block // 512)))
    return out


# ---------------------------------------------------------------- day 5, on a GPU: one row, many programs
@triton.jit
def split_softmax_kernel(x_ptr, y_ptr, sync_ptr, state_ptr, n_cols, n_splits, n_programs,
                         BLOCK: tl.constexpr, MAX_SPLITS: tl.constexpr, ONE_PIECE: tl.constexpr):
    # GPU only. A long row is split over n_splits programs, each holding BLOCK columns in registers:
    # each publishes its (m, l), waits for its siblings, merges their states (day 5's merge) and writes
    # its exponentials rescaled (one exp per element). Reads MN once, writes MN once.
    # sync_ptr holds int64 counters that only ever grow, [tickets, one arrival count per row], shared by
    # every launch of this geometry (n_programs programs, n_splits per row) on one stream: launch k hands out
    # tickets k*n_programs ... (k+1)*n_programs - 1, and a row is complete when its count reaches
    # (k+1)*n_splits. Nothing needs resetting, so a CUDA graph may replay the launch any number of times.
    # Programs take tickets in the order they start, so the siblings a program waits for are running already
    # or are among the next programs to start: no deadlock as long as n_splits programs fit on the GPU at once.
    # ONE_PIECE: each row fits one program, which has no sibling to wait for: no counters, no states.
    if ONE_PIECE:
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        p = tl.exp(x - tl.max(x, axis=0))
        tl.store(y_ptr + row * n_cols + cols, (p / tl.sum(p, axis=0)).to(y_ptr.dtype.element_ty), mask=cols < n_cols)
    else:
        ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
        launch_index = ticket // n_programs
        piece = ticket - launch_index * n_programs  # this launch's program number, in start order
        row = piece // n_splits
        cols = (piece - row * n_splits) * BLOCK + tl.arange(0, BLOCK)
        offsets = row * n_cols + cols
        x = tl.load(x_ptr + offsets, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        shift = tl.where(m == -float("inf"), 0.0, m)  # an all -inf piece publishes the empty state (-inf, 0)
        p = tl.exp(x - shift)  # kept: the output is p rescaled, one exponential per element in all
        tl.store(state_ptr + 2 * piece, m)
        tl.store(state_ptr + 2 * piece + 1, tl.sum(p, axis=0))
        complete = (launch_index + 1) * n_splits
        arrived = tl.atomic_add(sync_ptr + 1 + row, 1, sem="release") + 1
        while arrived < complete:
            arrived = tl.atomic_add(sync_ptr + 1 + row, 0, sem="acquire")
        sibling = row * n_splits + tl.arange(0, MAX_SPLITS)
        live = tl.arange(0, MAX_SPLITS) < n_splits
        ms = tl.load(state_ptr + 2 * sibling, mask=live, other=-3.0e38, cache_modifier=".cg")
        ls = tl.load(state_ptr + 2 * sibling + 1, mask=live, other=0.0, cache_modifier=".cg")
        m_row = tl.max(ms, axis=0)
        scale = tl.exp(shift - m_row) / tl.sum(ls * tl.exp(ms - m_row), axis=0)
        tl.store(y_ptr + offsets, (p * scale).to(y_ptr.dtype.element_ty), mask=cols < n_cols)


# Measured on an H100 (1024 x 65536 and 256 x 262144): 16 KB of a row per program, 32 columns per thread, ran
# best in both float32 (4096 columns, 4 warps: 0.95 and 0.90 of the copy ceiling) and bfloat16 (8192, 8 warps: 0.85
# and 0.80); 8192 float32 columns at 8 warps reached 0.86 and 0.80. On an H200 a sweep of 8-64 KB per program and
# 16-64 columns per thread found the same setting best (tune_split in course/w33_softmax/bench.py).
SPLIT_BYTES = 16384
_SCRATCH: dict = {}  # (device, stream, rows, splits) -> split_softmax_kernel's growing counters and its states


def _split_scratch(n_rows: int, n_splits: int, device) -> tuple:
    """split_softmax_kernel's int64 counters and float32 states for this geometry on this stream, kept between
    calls: launches on one stream run one after another, and each leaves the counters ready for the next."""
    key = (device, torch.cuda.current_stream(device).cuda_stream, n_rows, n_splits)
    if key not in _SCRATCH:
        _SCRATCH[key] = (torch.zeros(1 + n_rows, dtype=torch.int64, device=device),
                         torch.empty(2 * n_rows * n_splits, dtype=torch.float32, device=device))
    return _SCRATCH[key]


def split_softmax(x: torch.Tensor, out: torch.Tensor | None = None,
                  block: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """Row softmax on a GPU with each long row split across programs that merge their states (one read of x).
    `block` (columns per program, a power of two) and `num_warps` override SPLIT_BYTES' setting
    (tune_split in course/w33_softmax/bench.py sweeps them)."""
    if not ON_GPU:
        raise RuntimeError("split_softmax: its programs wait for each other, which only works on a GPU "
                           "(the interpreter runs one program at a time); use online_softmax")
    x2, out2, out, n_rows, n_cols = prepare_rows(x, out, "split_softmax")
    block = block or SPLIT_BYTES // x.element_size()
    splits = triton.cdiv(n_cols, block)
    if splits == 1:  # the row fits one program: a block just wide enough, as many warps as triton_softmax's
        block = row_block(n_cols)
        launch(split_softmax_kernel, (n_rows,), x2, out2, x2, x2, n_cols, 1, n_rows, BLOCK=block, MAX_SPLITS=2,
               ONE_PIECE=True, num_warps=num_warps or _row_warps(block, x.element_size()))
        return out
    sync, states = _split_scratch(n_rows, splits, x.device)
    launch(split_softmax_kernel, (n_rows * splits,), x2, out2, sync, states, n_cols, splits, n_rows * splits,
           BLOCK=block, MAX_SPLITS=max(2, triton.next_power_of_2(splits)), ONE_PIECE=False,
           num_warps=num_warps or max(1, block // 1024))
    return out


# ---------------------------------------------------------------- day 6: log-softmax, the fused relative
@triton.jit
def log_softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    # One program per row: y = x - max - log(sum(exp(x - max))). Reads MN, writes MN.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    ### BEGIN SOLUTION
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)
    shifted = x - tl.max(x, axis=0)
    y = shifted - tl.log(tl.sum(tl.exp(shifted), axis=0))
    tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    ### END SOLUTION


def log_softmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Row log-softmax, one Triton program per row (rows up to 64K columns)."""
    x2, out2, out, n_rows, n_cols = prepare_rows(x, out, "log_softmax")
    block = row_block(n_cols)
    if block > 65536:
        raise ValueError(f"log_softmax: rows of {n_cols} columns do not fit one block")
    launch(log_softmax_kernel, (n_rows,), x2, out2, n_cols, BLOCK=block, num_warps=_row_warps(block, x.element_size()))
    return out
