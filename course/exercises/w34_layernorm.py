"""Your exercises. Generated from solutions/w34_layernorm.py by `python -m course stubs`.

Replace every `YOUR CODE HERE` line with your code, then run the grading cell in the notebook
(or `python -m course grade w34.<exercise>`). The reference solutions are in solutions/w34_layernorm.py:
try first, peek later.
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

EPS = 1e-5
MAX_COLS = 65536  # the Triton kernels hold a whole row in one block
LONG_ROW = 8192   # longer rows: the backward takes them in two halves


# ---------------------------------------------------------------- day 2: Welford and Chan, in NumPy
def welford_variance(x: np.ndarray):
    """Mean and population variance of each row of `x`, in one pass over the columns (Welford)."""
    count = 0
    mean = np.zeros(x.shape[:-1], dtype=x.dtype)
    m2 = np.zeros_like(mean)
    for j in range(x.shape[-1]):
        value = x[..., j]
        # YOUR CODE HERE
    return mean, m2 / count


def chan_merge(n_a, mean_a, m2_a, n_b, mean_b, m2_b):
    """The (count, mean, M2) state of the union of two parts of the same rows (Chan et al. 1979).
    Empty parts have count 0, mean 0, M2 0."""
    # YOUR CODE HERE
    return n, mean, m2


# ---------------------------------------------------------------- day 3: LayerNorm forward in CUDA C
LN_THREADS = 256  # the launch below and THREADS in the source must agree

CUDA_LAYERNORM_SRC = r"""
// One block of THREADS threads per row. Each thread keeps a Welford state over its columns; the
// states meet in two shuffle trees (within each warp, then across warps). Reads the row twice
// (statistics, then the write pass, mostly from L2), writes it once, plus mean and rstd per row.
constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;

struct Stats { float n, mean, m2; };

__device__ Stats merge(Stats a, Stats b) {
    // YOUR CODE HERE
}

__device__ Stats warp_merge(Stats s) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        Stats other = {__shfl_xor_sync(0xffffffffu, s.n, offset), __shfl_xor_sync(0xffffffffu, s.mean, offset),
                       __shfl_xor_sync(0xffffffffu, s.m2, offset)};
        s = merge(s, other);
    }
    return s;
}

template <typename T>
__global__ void cuda_layernorm(const T* x, const T* weight, const T* bias, T* y, float* mean_out,
                               float* rstd_out, int n_cols, float eps) {
    __shared__ Stats partial[WARPS];
    const T* row = x + (size_t)blockIdx.x * n_cols;
    T* out = y + (size_t)blockIdx.x * n_cols;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

    Stats s = {0.f, 0.f, 0.f};
    for (int j = threadIdx.x; j < n_cols; j += THREADS) {  // Welford's update, one element at a time
        const float v = to_float(row[j]);
        s.n += 1.f;
        const float delta = v - s.mean;
        s.mean += delta / s.n;
        s.m2 += delta * (v - s.mean);
    }
    s = warp_merge(s);
    if (lane == 0) partial[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = warp_merge(lane < WARPS ? partial[lane] : Stats{0.f, 0.f, 0.f});
        if (lane == 0) partial[0] = s;
    }
    __syncthreads();
    s = partial[0];
    const float mean = s.mean;
    // YOUR CODE HERE
}
"""
cuda_layernorm_kernel = CudaKernel(CUDA_LAYERNORM_SRC, "cuda_layernorm")


def _check_params(op: str, x: torch.Tensor, *params: torch.Tensor) -> None:
    for p in params:
        if not isinstance(p, torch.Tensor) or p.shape != (x.shape[-1],) or p.dtype != x.dtype or p.device != x.device:
            got = f"{p.dtype} {tuple(p.shape)} on {p.device}" if isinstance(p, torch.Tensor) else type(p).__name__
            raise ValueError(f"{op}: weight and bias must be {x.dtype} vectors of length {x.shape[-1]} "
                             f"on {x.device}; got {got}")


def _stats_like(x: torch.Tensor) -> torch.Tensor:
    """One statistic per row (shape x.shape[:-1]), in the compute dtype. Made by torch.empty_like of a kept
    template: on a slow host that costs about half of torch.empty with a shape, a dtype and a device."""
    return torch.empty_like(_stats_template(x.shape[:-1], x.device, torch.float64 if x.dtype == torch.float64
                                            else torch.float32))


@functools.lru_cache(maxsize=64)
def _stats_template(shape: torch.Size, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def cuda_layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, out: torch.Tensor | None = None,
                   eps: float = EPS) -> torch.Tensor:
    """LayerNorm over the last dimension with the block-per-row CUDA C kernel (Welford statistics)."""
    x2, out2, out, n_rows, n_cols = prepare_rows(x, out, "cuda_layernorm")
    _check_params("cuda_layernorm", x, weight, bias)
    mean, rstd = _stats_like(x), _stats_like(x)
    cuda_layernorm_kernel((n_rows,), (LN_THREADS,), x2, weight, bias, out2, mean, rstd, n_cols, float(eps))
    return out


# ---------------------------------------------------------------- day 4: forward in Triton
def _compute_dtype(x: torch.Tensor):
    return tl.float64 if x.dtype == torch.float64 else tl.float32


def _sms(x: torch.Tensor) -> int:
    """Streaming multiprocessors of x's GPU; 3 on CPU, so persistent launches still have several programs."""
    return _sm_count(x.get_device()) if ON_GPU else 3


@functools.cache
def _sm_count(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=1024)  # asked on every call: the answer per row length is worked out once
def _row_launch(n_cols: int, element_size: int, op: str, bytes_per_warp: int = 4096) -> tuple[int, int]:
    """(BLOCK, num_warps) for a one-program-per-row kernel: `bytes_per_warp` of the row per warp, 4 to 16
    warps (swept on an H200: tune_rows in course/w34_layernorm/bench.py)."""
    if n_cols > MAX_COLS:
        raise ValueError(f"{op}: rows of {n_cols} columns do not fit one block (at most {MAX_COLS})")
    block = triton.next_power_of_2(n_cols)
    return block, max(4, min(16, block * element_size // bytes_per_warp))


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, eps,
                     BLOCK: tl.constexpr, COMPUTE: tl.constexpr):
    # One program per row, the whole row in registers, so the two-pass variance (mean first, then the
    # centred squares) costs no second read. Reads MN (+ 2N for w, b), writes MN + 2M.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    mean = tl.sum(x.to(COMPUTE), axis=0) / n_cols
    centred = tl.where(mask, x.to(COMPUTE) - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(COMPUTE)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(COMPUTE)
    y = (x.to(COMPUTE) - mean) * rstd * w + b
    tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def layernorm_loop_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_rows, n_cols, eps,
                          BLOCK: tl.constexpr, COMPUTE: tl.constexpr, STAGES: tl.constexpr):
    # layernorm_kernel's row, for long rows: program p normalises rows p, p + P, p + 2P, ... (P programs,
    # two per SM) holding w and b, in a row loop software-pipelined over STAGES rows, so the next rows'
    # x are on their way while this one is reduced. Reads MN (+ 2N per program), writes MN + 2M.
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(COMPUTE)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(COMPUTE)
    for i in tl.range(0, tl.cdiv(n_rows - pid, step), num_stages=STAGES):
        row = (pid + i * step).to(tl.int64)
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(COMPUTE)
        mean = tl.sum(x, axis=0) / n_cols
        centred = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / n_cols + eps)
        tl.store(y_ptr + row * n_cols + cols, (centred * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)


def layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, out: torch.Tensor | None = None,
              eps: float = EPS):
    """LayerNorm over the last dimension (Triton). Returns (y, mean, rstd); mean and rstd per row."""
    x2, out2, out, n_rows, n_cols = prepare_rows(x, out, "layernorm")
    _check_params("layernorm", x, weight, bias)
    mean, rstd = _stats_like(x), _stats_like(x)
    block, warps = _row_launch(n_cols, x.element_size(), "layernorm")
    args = (x2, weight, bias, out2, mean, rstd)
    if n_cols >= 8192 and block * x.element_size() <= 65536:  # long rows: the loop (bench.tune_rows, H200)
        launch(layernorm_loop_kernel, (min(2 * _sms(x), n_rows),), *args, n_rows, n_cols, eps, BLOCK=block,
               COMPUTE=_compute_dtype(x), STAGES=3, num_warps=8)
    else:
        launch(layernorm_kernel, (n_rows,), *args, n_cols, eps, BLOCK=block, COMPUTE=_compute_dtype(x), num_warps=warps)
    return out, mean, rstd


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, n_cols, eps, BLOCK: tl.constexpr, COMPUTE: tl.constexpr):
    # One program per row: y = x * rstd * w with rstd = 1 / sqrt(mean(x²) + eps). Reads MN, writes MN + M.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    # YOUR CODE HERE


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None, eps: float = EPS):
    """RMSNorm over the last dimension (Triton). Returns (y, rstd)."""
    x2, out2, out, n_rows, n_cols = prepare_rows(x, out, "rmsnorm")
    _check_params("rmsnorm", x, weight)
    rstd = _stats_like(x)
    block, warps = _row_launch(n_cols, x.element_size(), "rmsnorm", bytes_per_warp=1024)  # less work per byte
    launch(rmsnorm_kernel, (n_rows,), x2, weight, out2, rstd, n_cols, eps, BLOCK=block, COMPUTE=_compute_dtype(x),
           num_warps=warps)
    return out, rstd


# ---------------------------------------------------------------- day 5: backward
@triton.jit
def normalized_grad(xhat, wdy, rstd, n_cols, CENTRED: tl.constexpr):
    # dx of one row, from xhat = (x - mean) * rstd (x * rstd for RMSNorm) and wdy = w * dy, both
    # zero in the padding lanes.
    # YOUR CODE HERE
    return dx


@triton.jit
def norm_backward_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, part_ptr, n_rows, n_cols,
                         rows_per_program, part_stride, BLOCK: tl.constexpr, CENTRED: tl.constexpr,
                         COMPUTE: tl.constexpr, STAGES: tl.constexpr, WANT_DX: tl.constexpr):
    # Program p owns rows [p·R, p·R + R): it writes their dx and adds their dy·xhat (and dy) into its
    # partial rows of dγ (and dβ, n_cols further on), stored once at the end at part_ptr + p·part_stride:
    # stage 1 of the weight gradients. The row loop is
    # software-pipelined (STAGES): the next rows' x and dy are on their way while this one is reduced.
    # Reads 2MN (x, dy), writes MN (dx) + 2·P·N partials.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(COMPUTE)
    dw = tl.zeros([BLOCK], COMPUTE)
    db = tl.zeros([BLOCK], COMPUTE)
    first = pid * rows_per_program
    for i in tl.range(0, tl.minimum(rows_per_program, n_rows - first), num_stages=STAGES):
        row = first + i
        offsets = row.to(tl.int64) * n_cols + cols
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)
        rstd = tl.load(rstd_ptr + row)
        if CENTRED:
            x = x - tl.load(mean_ptr + row)
        xhat = tl.where(mask, x * rstd, 0.0)
        if WANT_DX:
            dx = normalized_grad(xhat, w * dy, rstd, n_cols, CENTRED)
            tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
    tl.store(part_ptr + pid * part_stride + cols, dw, mask=mask)
    if CENTRED:
        tl.store(part_ptr + pid * part_stride + n_cols + cols, db, mask=mask)


@triton.jit
def _sum_pairs(a1, a2, b1, b2):
    return a1 + b1, a2 + b2


@triton.jit
def _half_row(x_ptr, w_ptr, dy_ptr, base, cols, n_cols, mean, rstd):
    # x̂, dy and w·dy of half a row, zero past the row's end
    mask = cols < n_cols
    x = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(rstd.dtype)
    dy = tl.load(dy_ptr + base + cols, mask=mask, other=0.0).to(rstd.dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(rstd.dtype)
    return tl.where(mask, (x - mean) * rstd, 0.0), dy, w * dy


@triton.jit
def _half_dx(x_ptr, w_ptr, dy_ptr, dx_ptr, base, cols, n_cols, mean, rstd, c1, c2):
    xhat, dy, wdy = _half_row(x_ptr, w_ptr, dy_ptr, base, cols, n_cols, mean, rstd)
    tl.store(dx_ptr + base + cols, ((wdy - (xhat * c1 + c2)) * rstd).to(dx_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def long_row_backward_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, part_ptr, n_rows, n_cols,
                             rows_per_program, part_stride, HALF: tl.constexpr, CENTRED: tl.constexpr):
    # norm_backward_kernel for rows too long for the row, w and the dγ/dβ shares to fit the registers:
    # the row is taken in two halves, each adding into its own dγ, dβ shares; a half's two row sums are
    # reduced together (one barrier round), and dx re-reads both halves (from L1/L2). Same formula as
    # normalized_grad. Reads 2MN from HBM, writes MN + 2·P·N partials.
    pid = tl.program_id(0)
    lo = tl.arange(0, HALF)
    hi = HALF + lo
    dw_lo = tl.zeros([HALF], rstd_ptr.dtype.element_ty)
    dw_hi = tl.zeros([HALF], rstd_ptr.dtype.element_ty)
    db_lo = tl.zeros([HALF], rstd_ptr.dtype.element_ty)
    db_hi = tl.zeros([HALF], rstd_ptr.dtype.element_ty)
    first = pid * rows_per_program
    for i in range(0, tl.minimum(rows_per_program, n_rows - first)):
        row = first + i
        base = row.to(tl.int64) * n_cols
        rstd = tl.load(rstd_ptr + row)
        mean = tl.load(mean_ptr + row) if CENTRED else 0.0
        xhat, dy, wdy = _half_row(x_ptr, w_ptr, dy_ptr, base, lo, n_cols, mean, rstd)
        dw_lo += dy * xhat
        db_lo += dy
        s1, s2 = tl.reduce((xhat * wdy, wdy), 0, _sum_pairs)
        xhat, dy, wdy = _half_row(x_ptr, w_ptr, dy_ptr, base, hi, n_cols, mean, rstd)
        dw_hi += dy * xhat
        db_hi += dy
        t1, t2 = tl.reduce((xhat * wdy, wdy), 0, _sum_pairs)
        c1 = (s1 + t1) / n_cols
        c2 = (s2 + t2) / n_cols if CENTRED else 0.0
        _half_dx(x_ptr, w_ptr, dy_ptr, dx_ptr, base, hi, n_cols, mean, rstd, c1, c2)  # the half read last first
        _half_dx(x_ptr, w_ptr, dy_ptr, dx_ptr, base, lo, n_cols, mean, rstd, c1, c2)
    out = part_ptr + pid * part_stride
    tl.store(out + lo, dw_lo, mask=lo < n_cols)
    tl.store(out + hi, dw_hi, mask=hi < n_cols)
    if CENTRED:
        tl.store(out + n_cols + lo, db_lo, mask=lo < n_cols)
        tl.store(out + n_cols + hi, db_hi, mask=hi < n_cols)


@triton.jit
def weight_grad_kernel(part_ptr, out_ptr, n_parts, n_cols, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    # Stage 2: program j sums columns [j·BLOCK_N, (j+1)·BLOCK_N) of the [n_parts, n_cols] partial
    # rows over all parts, BLOCK_P parts at a time. Reads P·N, writes N.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    # YOUR CODE HERE
    tl.store(out_ptr + cols, total.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


SUM_COLS = 32  # columns per program of weight_grad_kernel (tune_weight_grad in the week's bench.py: 32 beats 16-256)


def _sum_parts(parts: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    n_parts, n_cols = parts.shape
    out = torch.empty(n_cols, dtype=like.dtype, device=like.device)
    block_n = min(SUM_COLS, triton.next_power_of_2(n_cols))
    launch(weight_grad_kernel, (triton.cdiv(n_cols, block_n),), parts, out, n_parts, n_cols,
           BLOCK_P=32 if ON_GPU else 4, BLOCK_N=block_n, num_warps=4)
    return out


def norm_backward(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, mean: torch.Tensor | None,
                  rstd: torch.Tensor, programs: int | None = None, want_dx: bool = True, want_weights: bool = True):
    """Gradients of LayerNorm (mean given) or RMSNorm (mean None) from the saved statistics.
    Returns (dx, dweight, dbias); dbias is None for RMSNorm, dx is not written when want_dx is False, and
    dweight, dbias are None when want_weights is False (stage 2, weight_grad_kernel, is then not launched)."""
    x2, dx2, dx, n_rows, n_cols = prepare_rows(x, None, "norm_backward")
    _check_params("norm_backward", x, weight)
    if dy.shape != x.shape or dy.dtype != x.dtype or not dy.is_contiguous():
        raise ValueError(f"norm_backward: dy must be a contiguous {x.dtype} tensor of shape {tuple(x.shape)}")
    block, _ = _row_launch(n_cols, x.element_size(), "norm_backward")
    short = n_cols * x.element_size() <= 8192  # rows of at most 8 KB (settings swept on an H200)
    long = want_dx and n_cols > LONG_ROW        # the row in two halves: long_row_backward_kernel
    if programs is None:  # one or two programs per SM; on CPU a few, so stage 2 has parts to sum
        programs = (2 if short else 1) * _sms(x)
    rows_per_program = triton.cdiv(n_rows, min(programs, n_rows))
    n_parts = triton.cdiv(n_rows, rows_per_program)
    centred = mean is not None
    # one [P, 2N] array of partial rows (dγ then dβ; [P, N] for RMSNorm), so one stage-2 launch sums both
    parts = torch.empty((n_parts, (2 if centred else 1) * n_cols), dtype=rstd.dtype, device=x.device)
    # RMSNorm has no mean: rstd stands in for mean_ptr (never read when CENTRED is False)
    args = (x2, weight, dy.view(-1, n_cols), mean if centred else rstd, rstd, dx2, parts, n_rows, n_cols,
            rows_per_program, parts.shape[1])
    if long:
        launch(long_row_backward_kernel, (n_parts,), *args, HALF=block // 2, CENTRED=centred, num_warps=16)
    else:
        launch(norm_backward_kernel, (n_parts,), *args, BLOCK=block, CENTRED=centred, COMPUTE=_compute_dtype(x),
               WANT_DX=want_dx, STAGES=3 if n_cols <= 8192 else 1, num_warps=4 if n_cols <= 4096 else 8)
    if not want_weights:
        return dx, None, None
    sums = _sum_parts(parts, x)
    return dx, sums[:n_cols], sums[n_cols:] if centred else None


def layernorm_dx(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dL/dx of LayerNorm (bias 0) for upstream gradient dy: forward for the statistics, then backward."""
    _, mean, rstd = layernorm(x, weight, torch.zeros_like(weight))
    return norm_backward(x, weight, dy, mean, rstd, want_weights=False)[0]  # gradable before norm_weight_grad


def norm_weight_grad(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor):
    """(dL/dweight, dL/dbias) of LayerNorm for upstream gradient dy, through the two-stage reduction."""
    _, mean, rstd = layernorm(x, weight, torch.zeros_like(weight))
    _, dweight, dbias = norm_backward(x, weight, dy, mean, rstd, want_dx=False)  # gradable before layernorm_dx
    return dweight, dbias


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm with the course's Triton kernels: `LayerNormFunction.apply(x, weight, bias, eps)`."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps=EPS):
        y, mean, rstd = layernorm(x.contiguous(), weight, bias, eps=eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dweight, dbias = norm_backward(x.contiguous(), weight, dy.contiguous(), mean, rstd)
        return dx, dweight, dbias, None


class RMSNormFunction(torch.autograd.Function):
    """RMSNorm with the course's Triton kernels: `RMSNormFunction.apply(x, weight, eps)`."""

    @staticmethod
    def forward(ctx, x, weight, eps=EPS):
        y, rstd = rmsnorm(x.contiguous(), weight, eps=eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dweight, _ = norm_backward(x.contiguous(), weight, dy.contiguous(), None, rstd)
        return dx, dweight, None


# ---------------------------------------------------------------- day 6: fused residual add + RMSNorm
@triton.jit
def fused_add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, n_cols, eps, BLOCK: tl.constexpr,
                             COMPUTE: tl.constexpr):
    # One program per row of a pre-norm block: h = x + residual (stored: the next block's residual),
    # y = RMSNorm(h) · w from the registers. Reads 2MN, writes 2MN; unfused, add + norm move 5MN.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    offsets = row * n_cols + cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(COMPUTE)  # first: its latency hides under x's
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    r = tl.load(r_ptr + offsets, mask=mask, other=0.0)
    # YOUR CODE HERE


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None,
                      eps: float = EPS):
    """h = x + residual and y = RMSNorm(h) · weight in one pass. Returns (y, h)."""
    x2, out2, out, n_rows, n_cols = prepare_rows(x, out, "fused_add_rmsnorm")
    _check_params("fused_add_rmsnorm", x, weight)
    if residual.shape != x.shape or residual.dtype != x.dtype or not residual.is_contiguous():
        raise ValueError(f"fused_add_rmsnorm: residual must be a contiguous {x.dtype} tensor of shape {tuple(x.shape)}")
    h = torch.empty_like(x)
    block, warps = _row_launch(n_cols, x.element_size(), "fused_add_rmsnorm")
    launch(fused_add_rmsnorm_kernel, (n_rows,), x2, residual.view(-1, n_cols), weight, out2, h.view(-1, n_cols), n_cols,
           eps, BLOCK=block, COMPUTE=_compute_dtype(x), num_warps=warps)
    return out, h
