"""Your exercises. Generated from solutions/w39_kernel_fusion.py by `python -m course stubs`.

Replace every `YOUR CODE HERE` line with your code, then run the grading cell in the notebook
(or `python -m course grade w39.<exercise>`). The reference solutions are in solutions/w39_kernel_fusion.py:
try first, peek later.
"""
import functools
import math
import numbers

import numpy as np
import torch
import triton
import triton.language as tl

from course.backend import ON_GPU
from course.cuda import CudaKernel
from course.launch import launch
from course.rows import prepare_rows


# ---------------------------------------------------------------- day 1: bytes saved per fusion (NumPy)
STAT_BYTES = 4  # a per-row statistic (LayerNorm's mean and rstd, RMSNorm's rstd) is float32 whatever the dtype
# What each elementwise op moves besides its (m, n) input and output: extra inputs, "vectors" of n elements and
# "tensors" of m × n, in the tensors' itemsize; side outputs, "stats": one float32 per row each. The same table
# as course/w39_kernel_fusion/reference.py's OPS (tests/test_w39_activations.py keeps the two equal).
OPS = {
    "bias":      {"vectors": 1, "tensors": 0, "stats": 0},  # + b, one value per column
    "gelu":      {"vectors": 0, "tensors": 0, "stats": 0},
    "silu":      {"vectors": 0, "tensors": 0, "stats": 0},
    "dropout":   {"vectors": 0, "tensors": 0, "stats": 0},  # the mask is regenerated from (seed, offset), never stored
    "residual":  {"vectors": 0, "tensors": 1, "stats": 0},  # + the residual stream, m × n
    "layernorm": {"vectors": 2, "tensors": 0, "stats": 2},  # weight and bias; saves mean and rstd per row
    "rmsnorm":   {"vectors": 1, "tensors": 0, "stats": 1},  # weight; saves rstd per row
}


def fusion_bytes(chain, m: int, n: int, itemsize: int) -> tuple[int, int]:
    """HBM bytes, as (unfused, fused), of the elementwise ops `chain` (names of OPS, applied in order) on an (m, n)
    tensor of `itemsize`-byte elements.
    Unfused, each op is a kernel of its own: it reads its input and writes its output (m·n elements each), and
    moves its own extra inputs and side outputs. Fused, one kernel reads the chain's input once and writes its final
    output once; the results in between stay in registers; every op's extras still move, once.
    Not counted: an intermediate a model must also keep (a pre-norm block's residual stream h), which costs the
    fused kernel one more m·n write."""
    unknown = [op for op in chain if op not in OPS]
    if unknown:
        raise ValueError(f"fusion_bytes: unknown ops {unknown}; known: {', '.join(OPS)}")
    # YOUR CODE HERE
    return unfused, fused


# ---------------------------------------------------------------- day 2: bias + activation, forward and backward
APPROXIMATIONS = ("none", "tanh")  # GELU's exact erf form and its tanh approximation (PyTorch's `approximate`)
DBIAS_BLOCK = 64  # bias_gelu_backward_kernel's square tiles (rows × columns); course/w39_kernel_fusion/tasks.py agrees
ACTIVATION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def gelu(z, TANH: tl.constexpr):
    # GELU of a float32 block (Hendrycks & Gimpel, "Gaussian Error Linear Units (GELUs)"): z·Φ(z) with
    # Φ(z) = (1 + erf(z / √2)) / 2, or with TANH the approximation 0.5·z·(1 + tanh(√(2/π)·(z + 0.044715·z³))).
    # YOUR CODE HERE
    return y


@triton.jit
def bias_gelu_kernel(x_ptr, b_ptr, y_ptr, n_rows, n_cols, TANH: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    # One program per BLOCK_M × BLOCK_N tile of the (n_rows, n_cols) view: y = GELU(x + b), b[c] added to column
    # c of every row, the tile's slice of b loaded once. Reads MN (+ N per row of tiles), writes MN.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    # YOUR CODE HERE


def _is_tanh(op: str, approximate: str) -> bool:
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"{op}: approximate must be one of {APPROXIMATIONS}, got {approximate!r}")
    return approximate == "tanh"


def _check_activation(op: str, x: torch.Tensor, bias: torch.Tensor | None = None, **same: torch.Tensor) -> None:
    """x in a kernel's dtypes; `bias`, if given, a vector of x.shape[-1] values of x's dtype on x's device; every
    tensor of `same` (dy, up, ...) of x's shape, dtype and device, contiguous."""
    if x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"{op}: inputs must be float32, float16 or bfloat16 (the kernels compute in float32); "
                         f"got {x.dtype}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (x.shape[-1],)
                             or bias.dtype != x.dtype or bias.device != x.device):
        got = f"{bias.dtype} {tuple(bias.shape)} on {bias.device}" if isinstance(bias, torch.Tensor) else type(bias)
        raise ValueError(f"{op}: bias must be a {x.dtype} vector of length {x.shape[-1]} on {x.device}; got {got}")
    for name, t in same.items():
        if not isinstance(t, torch.Tensor) or t.shape != x.shape or t.dtype != x.dtype or t.device != x.device \
                or not t.is_contiguous():
            raise ValueError(f"{op}: {name} must be a contiguous {x.dtype} tensor of shape {tuple(x.shape)} on "
                             f"{x.device}")


def _tile(n_cols: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of an elementwise tile: up to 1024 columns, about 4096 elements in all."""
    block_n = min(max(16, triton.next_power_of_2(n_cols)), 1024)
    return max(1, 4096 // block_n), block_n


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none",
              out: torch.Tensor | None = None) -> torch.Tensor:
    """y = GELU(x + bias) in one pass (Triton): x is (..., n), bias (n,), added along the last axis.
    approximate="none" is the exact erf form, "tanh" the tanh approximation (as torch.nn.functional.gelu)."""
    tanh = _is_tanh("bias_gelu", approximate)
    x2, out2, out, n_rows, n_cols = prepare_rows(x, out, "bias_gelu")
    _check_activation("bias_gelu", x, bias)
    block_m, block_n = _tile(n_cols)
    launch(bias_gelu_kernel, (triton.cdiv(n_rows, block_m), triton.cdiv(n_cols, block_n)), x2, bias, out2, n_rows,
           n_cols, TANH=tanh, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4)
    return out


@triton.jit
def gelu_grad(z, TANH: tl.constexpr):
    # dGELU/dz of a float32 block: Φ(z) + z·φ(z) for the erf form, φ(z) = exp(−z²/2) / √(2π); for the tanh form,
    # with u = √(2/π)·(z + 0.044715·z³): 0.5·(1 + tanh u) + 0.5·z·(1 − tanh² u)·√(2/π)·(1 + 3·0.044715·z²).
    # YOUR CODE HERE
    return grad


@triton.jit
def bias_gelu_backward_kernel(x_ptr, b_ptr, dy_ptr, dx_ptr, part_ptr, n_rows, n_cols, rows_per_program,
                              TANH: tl.constexpr, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    # Program (p, j) owns rows [p·R, p·R + R) of column block j, BLOCK × BLOCK tiles at a time: it writes their
    # dx = dy·GELU'(x + b) and sums each column's dx into its partial row of dbias, stored once at the end at
    # part_ptr + p·n_cols (stage 1 of dbias). Reads 2MN (+ N per program), writes MN + P·N.
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    col_mask = cols < n_cols
    b = tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    first = tl.program_id(0) * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    column_sums = tl.zeros([BLOCK, BLOCK], tl.float32)  # per-thread running sums: one cross-warp sum, at the end
    for start in tl.range(first, last, BLOCK, num_stages=STAGES):  # the next tiles' loads start early
        rows = start + tl.arange(0, BLOCK)
        mask = (rows[:, None] < last) & col_mask[None, :]
        offsets = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dx = dy * gelu_grad(x + b[None, :], TANH)  # masked lanes have dy = 0, so dx = 0 there
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        # YOUR CODE HERE
    # YOUR CODE HERE


@triton.jit
def bias_grad_kernel(part_ptr, db_ptr, n_parts, n_cols, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    # Stage 2 of dbias: program j sums columns [j·BLOCK_N, (j+1)·BLOCK_N) of the (n_parts, n_cols) partial rows,
    # BLOCK_P rows at a time, always in the same order (the same dbias on every run). Reads P·N, writes N.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    # YOUR CODE HERE
    tl.store(db_ptr + cols, db_total.to(db_ptr.dtype.element_ty), mask=cols < n_cols)


def _dbias_programs(x: torch.Tensor) -> int:
    """Programs to aim for: eight per SM of x's GPU, so enough loads are in flight; 6 on CPU, so the partial sums
    still have several rows."""
    return 8 * torch.cuda.get_device_properties(x.device).multi_processor_count if ON_GPU else 6


def _dbias_layout(n_rows: int, n_cols: int, programs: int) -> tuple[int, int]:
    """(rows per program, number of partial rows) of bias_gelu_backward_kernel: whole tiles of DBIAS_BLOCK rows per
    program, about `programs` programs over all column blocks."""
    tiles = triton.cdiv(n_rows, DBIAS_BLOCK)
    wanted = max(1, triton.cdiv(programs, triton.cdiv(n_cols, DBIAS_BLOCK)))
    rows_per_program = DBIAS_BLOCK * triton.cdiv(tiles, min(wanted, tiles))
    return rows_per_program, triton.cdiv(n_rows, rows_per_program)


def bias_gelu_backward(x: torch.Tensor, bias: torch.Tensor, dy: torch.Tensor, approximate: str = "none"):
    """Gradients of y = GELU(x + bias) for upstream gradient dy: (dx, dbias), dx = dy·GELU'(x + bias) and
    dbias = Σ over all rows of dx. dbias is summed in float32 (per program, then across programs in a fixed order)
    and returned in x's dtype, like the bias it belongs to."""
    tanh = _is_tanh("bias_gelu_backward", approximate)
    x2, dx2, dx, n_rows, n_cols = prepare_rows(x, None, "bias_gelu_backward")
    _check_activation("bias_gelu_backward", x, bias, dy=dy)
    rows_per_program, n_parts = _dbias_layout(n_rows, n_cols, _dbias_programs(x))
    parts = torch.empty((n_parts, n_cols), dtype=torch.float32, device=x.device)
    launch(bias_gelu_backward_kernel, (n_parts, triton.cdiv(n_cols, DBIAS_BLOCK)), x2, bias, dy.view(-1, n_cols), dx2,
           parts, n_rows, n_cols, rows_per_program, TANH=tanh, BLOCK=DBIAS_BLOCK, STAGES=3, num_warps=8)
    dbias = torch.empty(n_cols, dtype=x.dtype, device=x.device)
    block_n = min(128, max(16, triton.next_power_of_2(n_cols)))
    launch(bias_grad_kernel, (triton.cdiv(n_cols, block_n),), parts, dbias, n_parts, n_cols,
           BLOCK_P=32 if ON_GPU else 4, BLOCK_N=block_n, num_warps=4)
    return dx, dbias


class BiasGelu(torch.autograd.Function):
    """GELU(x + bias) with the course's Triton kernels: `BiasGelu.apply(x, bias, approximate)`."""

    @staticmethod
    def forward(ctx, x, bias, approximate="none"):
        x = x.contiguous()
        ctx.save_for_backward(x, bias)
        ctx.approximate = approximate
        return bias_gelu(x, bias, approximate)

    @staticmethod
    def backward(ctx, dy):
        x, bias = ctx.saved_tensors
        dx, dbias = bias_gelu_backward(x, bias, dy.contiguous(), ctx.approximate)
        return dx, dbias, None


# SiLU, SwiGLU and GeGLU: y = act(gate) (· up), elementwise over the flat tensors
@triton.jit
def _activation(z, ACT: tl.constexpr):
    if ACT == "silu":
        y = z * tl.sigmoid(z)
    else:
        y = gelu(z, ACT == "gelu_tanh")
    return y


@triton.jit
def _activation_grad(z, ACT: tl.constexpr):
    if ACT == "silu":
        s = tl.sigmoid(z)
        grad = s + z * s * tl.sigmoid(-z)  # σ(z)·(1 + z·(1 − σ(z)))
    else:
        grad = gelu_grad(z, ACT == "gelu_tanh")
    return grad


@triton.jit
def glu_kernel(gate_ptr, up_ptr, y_ptr, n_elements, ACT: tl.constexpr, GATED: tl.constexpr, BLOCK: tl.constexpr):
    # One program per BLOCK elements: y = act(gate)·up (GATED), else y = act(gate).
    # Reads 2MN (MN without up), writes MN.
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    y = _activation(tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32), ACT)
    if GATED:
        y = y * tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def glu_backward_kernel(gate_ptr, up_ptr, dy_ptr, dgate_ptr, dup_ptr, n_elements, ACT: tl.constexpr,
                        GATED: tl.constexpr, BLOCK: tl.constexpr):
    # One program per BLOCK elements: dgate = dy·up·act'(gate) and dup = dy·act(gate) (GATED), else
    # dgate = dy·act'(gate). Reads 3MN, writes 2MN (2MN and MN without up).
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    gate = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if GATED:
        up = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(dup_ptr + offsets, (dy * _activation(gate, ACT)).to(dup_ptr.dtype.element_ty), mask=mask)
        dy = dy * up
    tl.store(dgate_ptr + offsets, (dy * _activation_grad(gate, ACT)).to(dgate_ptr.dtype.element_ty), mask=mask)


GLU_BLOCK = 1024


def _glu(op: str, act: str, gate: torch.Tensor, up: torch.Tensor | None, out: torch.Tensor | None) -> torch.Tensor:
    gate2, out2, out, _, _ = prepare_rows(gate, out, op)
    _check_activation(op, gate, **({"up": up} if up is not None else {}))
    n = gate.numel()
    launch(glu_kernel, (triton.cdiv(n, GLU_BLOCK),), gate2, gate2 if up is None else up, out2, n, ACT=act,
           GATED=up is not None, BLOCK=GLU_BLOCK, num_warps=4)
    return out


def _glu_backward(op: str, act: str, gate: torch.Tensor, up: torch.Tensor | None, dy: torch.Tensor):
    gate2, dgate2, dgate, _, _ = prepare_rows(gate, None, op)
    _check_activation(op, gate, dy=dy, **({"up": up} if up is not None else {}))
    dup = torch.empty_like(gate) if up is not None else None
    n = gate.numel()
    launch(glu_backward_kernel, (triton.cdiv(n, GLU_BLOCK),), gate2, gate2 if up is None else up, dy, dgate2,
           dgate2 if dup is None else dup, n, ACT=act, GATED=up is not None, BLOCK=GLU_BLOCK, num_warps=4)
    return dgate, dup


def _gelu_act(op: str, approximate: str) -> str:
    return "gelu_tanh" if _is_tanh(op, approximate) else "gelu"


def silu(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """SiLU (swish), y = x·sigmoid(x), elementwise (Triton)."""
    return _glu("silu", "silu", x, None, out)


def silu_backward(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx = dy·σ(x)·(1 + x·(1 − σ(x))) of SiLU."""
    return _glu_backward("silu_backward", "silu", x, None, dy)[0]


def swiglu(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU's product, y = silu(gate)·up (Shazeer, "GLU Variants Improve Transformer"), in one pass."""
    return _glu("swiglu", "silu", gate, up, out)


def swiglu_backward(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor):
    """(dgate, dup) of y = silu(gate)·up: dgate = dy·up·silu'(gate), dup = dy·silu(gate)."""
    return _glu_backward("swiglu_backward", "silu", gate, up, dy)


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none",
          out: torch.Tensor | None = None) -> torch.Tensor:
    """GeGLU's product, y = GELU(gate)·up, in one pass."""
    return _glu("geglu", _gelu_act("geglu", approximate), gate, up, out)


def geglu_backward(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor, approximate: str = "none"):
    """(dgate, dup) of y = GELU(gate)·up: dgate = dy·up·GELU'(gate), dup = dy·GELU(gate)."""
    return _glu_backward("geglu_backward", _gelu_act("geglu_backward", approximate), gate, up, dy)


class SwiGLU(torch.autograd.Function):
    """silu(gate)·up with the course's Triton kernels: `SwiGLU.apply(gate, up)`."""

    @staticmethod
    def forward(ctx, gate, up):
        gate, up = gate.contiguous(), up.contiguous()
        ctx.save_for_backward(gate, up)
        return swiglu(gate, up)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        return swiglu_backward(gate, up, dy.contiguous())


# The same bias + GELU in CUDA C
BIAS_GELU_THREADS, BIAS_GELU_ITEMS = 256, 4  # the launch below and THREADS, ITEMS in the source must agree

CUDA_BIAS_GELU_SRC = r"""
// Block (r, c) of the grid covers columns [c·ITEMS·THREADS, (c+1)·ITEMS·THREADS) of row r; each thread takes ITEMS
// of them, THREADS apart (so a warp's loads stay contiguous), all loaded before any is computed.
// y = GELU(x + bias[col]), in float; tanh_form picks the tanh approximation. Reads MN + N, writes MN.
constexpr int THREADS = 256, ITEMS = 4;

__device__ float gelu_erf(float z) { return 0.5f * z * (1.f + erff(z * 0.70710678f)); }

__device__ float gelu_tanh(float z) {
    return 0.5f * z * (1.f + tanhf(0.79788456f * (z + 0.044715f * z * z * z)));
}

template <typename T>
__global__ void cuda_bias_gelu(const T* x, const T* bias, T* y, int n_cols, int tanh_form) {
    const int first = blockIdx.y * ITEMS * THREADS + threadIdx.x;
    const size_t row = (size_t)blockIdx.x * n_cols;
    float z[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const int col = first + k * THREADS;
        z[k] = col < n_cols ? to_float(x[row + col]) + to_float(bias[col]) : 0.f;
    }
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const int col = first + k * THREADS;
        if (col < n_cols) y[row + col] = from_float<T>(tanh_form ? gelu_tanh(z[k]) : gelu_erf(z[k]));
    }
}
"""
cuda_bias_gelu_kernel = CudaKernel(CUDA_BIAS_GELU_SRC, "cuda_bias_gelu")


def cuda_bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none",
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """bias_gelu with the one-thread-per-element CUDA C kernel."""
    tanh = _is_tanh("cuda_bias_gelu", approximate)
    x2, out2, out, n_rows, n_cols = prepare_rows(x, out, "cuda_bias_gelu")
    _check_activation("cuda_bias_gelu", x, bias)
    chunks = triton.cdiv(n_cols, BIAS_GELU_ITEMS * BIAS_GELU_THREADS)
    cuda_bias_gelu_kernel((n_rows, chunks), (BIAS_GELU_THREADS,), x2, bias, out2, n_cols, int(tanh))
    return out


# A GEMM with bias + GELU in its epilogue
@triton.jit
def matmul_bias_gelu_kernel(a_ptr, w_ptr, bias_ptr, y_ptr, M, N, K, stride_am, stride_ak, stride_wk, stride_wn,
                            TANH: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # One program per BLOCK_M × BLOCK_N tile of y = GELU(a @ w + bias): the K loop accumulates a @ w in float32,
    # then the epilogue adds the bias and applies GELU in registers, before the tile's one store. Programs run
    # GROUP_M row tiles at a time down each column of tiles, so programs running together share w's tiles in L2.
    # Reads MK·(N / BLOCK_N) + KN·(M / BLOCK_M) + N at most (less with L2 hits), writes MN.
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    group_rows = tl.minimum(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % group_rows
    pid_n = (pid % (GROUP_M * tiles_n)) // group_rows
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        a = tl.load(a_ptr + rows[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0)
        w = tl.load(w_ptr + k[:, None] * stride_wk + cols[None, :] * stride_wn,
                    mask=(k[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
    bias_row = tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    out = gelu(acc + bias_row[None, :], TANH)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], out.to(y_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def _gemm_config(a: torch.Tensor) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of matmul_bias_gelu_kernel: for 16-bit inputs the best of
    seven tilings on an H200 ((8192, 4096) @ (4096, 4096) bf16: 610 TFLOP/s); small tiles in the interpreter."""
    if not ON_GPU:
        return 32, 32, 16, 4, 1
    return (128, 256, 64, 8, 4) if a.element_size() == 2 else (128, 128, 32, 8, 3)


def matmul_bias_gelu(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, approximate: str = "none",
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """y = GELU(a @ w + bias) in one kernel: a (M, K), w (K, N) at any strides (a Linear's weight.t() works),
    bias (N,); y (M, N) contiguous. float32 inputs multiply in full float32 ("ieee", as torch.matmul does by
    default), 16-bit inputs on tensor cores; the accumulator is float32 either way."""
    tanh = _is_tanh("matmul_bias_gelu", approximate)
    if a.dim() != 2 or w.dim() != 2 or a.shape[1] != w.shape[0]:
        raise ValueError(f"matmul_bias_gelu: need a (M, K) and w (K, N); got {tuple(a.shape)} and {tuple(w.shape)}")
    if w.dtype != a.dtype or w.device != a.device:
        raise ValueError(f"matmul_bias_gelu: w must be {a.dtype} on {a.device}; got {w.dtype} on {w.device}")
    (m, k), n = a.shape, w.shape[1]
    _check_activation("matmul_bias_gelu", w, bias)  # w is (K, N): its last axis is the bias's
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    elif out.shape != (m, n) or out.dtype != a.dtype or out.device != a.device or not out.is_contiguous():
        raise ValueError(f"matmul_bias_gelu: out must be a contiguous {a.dtype} tensor of shape {(m, n)} on {a.device}")
    block_m, block_n, block_k, warps, stages = _gemm_config(a)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    launch(matmul_bias_gelu_kernel, grid, a, w, bias, out, m, n, k, a.stride(0), a.stride(1), w.stride(0),
           w.stride(1), TANH=tanh, PRECISION="ieee" if a.dtype == torch.float32 else "tf32", BLOCK_M=block_m,
           BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, num_warps=warps, num_stages=stages)
    return out


# ---------------------------------------------------------------- day 3: dropout + residual with a counter-based RNG
# Dropout's mask is never stored: element i takes draw u = offset + i of the stream of that seed (Philox4x32-10, a
# pure function of the seed and the counter), is kept where u >= p and scaled by 1 / (1 - p); the backward draws the
# same u again. One Philox call gives four 32-bit words: draw g is word g % 4 of counter g // 4, so a block of draws
# costs a quarter of the Philox rounds that tl.rand (one word per call) would.
DROPOUT_BLOCK = 2048 if ON_GPU else 4096  # elements per program (the interpreter pays per program, not per element)
DROPOUT_WARPS = 4
SEED_LIMIT = 2 ** 63  # seeds and counters are non-negative int64
FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _check_tensor(op: str, name: str, t, like: torch.Tensor | None = None) -> None:
    """A clear error unless `t` is a contiguous float16 / bfloat16 / float32 tensor where Triton runs (the GPU, or
    the CPU under the interpreter), with `like`'s shape and dtype when given."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor; got {type(t).__name__}")
    if t.dtype not in FLOATS:
        raise ValueError(f"{op}: {name} must be float16, bfloat16 or float32; got {t.dtype}")
    if t.is_cuda != ON_GPU:
        raise ValueError(f"{op}: {name} must be on the {'GPU' if ON_GPU else 'CPU'} (where Triton runs on this "
                         f"machine); got {t.device}")
    if like is not None and (t.shape != like.shape or t.dtype != like.dtype or t.device != like.device):
        raise ValueError(f"{op}: {name} must be a {like.dtype} tensor of shape {tuple(like.shape)} on {like.device}; "
                         f"got {t.dtype} {tuple(t.shape)} on {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous (call .contiguous() first); got strides {t.stride()}")


def _check_dropout(op: str, numel: int, p, seed, offset) -> None:
    """A clear error unless 0 <= p < 1, 0 <= seed < 2^63 and the draws offset ... offset + numel - 1 fit int64."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p < 1.0:
        raise ValueError(f"{op}: p, the probability of dropping an element, must be in [0, 1); got {p!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"{op}: seed must be an integer in [0, 2^63); got {seed!r}")
    if isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or not 0 <= offset <= SEED_LIMIT - numel:
        raise ValueError(f"{op}: offset must be an integer >= 0 with offset + numel <= 2^63; got {offset!r}")


@triton.jit
def philox_draws(seed, first, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    # BLOCK float32 draws in [0, 1): draws first, first + 1, ... of the stream of that seed, draw g being word g % 4
    # of Philox4x32-10 at counter g // 4. ALIGNED (first a multiple of 4): one Philox per four draws, its words
    # interleaved into the block. Otherwise each draw runs its counter's Philox and keeps its own word.
    if ALIGNED:
        u0, u1, u2, u3 = tl.rand4x(seed, first // 4 + tl.arange(0, BLOCK // 4))
        u = tl.reshape(tl.join(tl.join(u0, u2), tl.join(u1, u3)), [BLOCK])  # [k, j, i] is draw 4k + 2j + i
    else:
        g = first + tl.arange(0, BLOCK)
        u0, u1, u2, u3 = tl.rand4x(seed, g // 4)
        word = g % 4
        u = tl.where(word == 0, u0, tl.where(word == 1, u1, tl.where(word == 2, u2, u3)))
    return u


def _aligned(*counts: int) -> bool:
    """philox_draws' ALIGNED: every block of draws starts at a multiple of 4 (an offset and a row length that are)."""
    return all(count % 4 == 0 for count in counts)


@triton.jit
def dropout_block(x, u, p):
    # Inverted dropout of a float32 block with its draws u (philox_draws): x / (1 - p) where u >= p, else 0. The
    # draws are a pure function of (seed, position), so the same arguments give the same mask in any pass.
    # YOUR CODE HERE
    return dropped


@triton.jit
def dropout_residual_kernel(x_ptr, r_ptr, y_ptr, n_elements, p, seed, offset, BLOCK: tl.constexpr,
                            ALIGNED: tl.constexpr):
    # One program per BLOCK elements of the flat tensor: y = residual + dropout(x), element i taking draw
    # offset + i. Reads 2N, writes N; the mask is never stored.
    start = tl.program_id(0).to(tl.int64) * BLOCK
    i = start + tl.arange(0, BLOCK)
    inside = i < n_elements
    x = tl.load(x_ptr + i, mask=inside, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + i, mask=inside, other=0.0).to(tl.float32)
    # YOUR CODE HERE
    tl.store(y_ptr + i, y.to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def dropout_residual_backward_kernel(dy_ptr, dx_ptr, n_elements, p, seed, offset, BLOCK: tl.constexpr,
                                     ALIGNED: tl.constexpr):
    # One program per BLOCK elements: dx = dropout(dy) with the forward's mask, drawn again at the forward's
    # positions of the stream instead of read back. Reads N, writes N (the residual's gradient is dy itself).
    start = tl.program_id(0).to(tl.int64) * BLOCK
    i = start + tl.arange(0, BLOCK)
    inside = i < n_elements
    dy = tl.load(dy_ptr + i, mask=inside, other=0.0).to(tl.float32)
    # YOUR CODE HERE
    tl.store(dx_ptr + i, dx.to(dx_ptr.dtype.element_ty), mask=inside)


def dropout_residual_forward(x: torch.Tensor, residual: torch.Tensor, p: float, seed: int, offset: int = 0,
                             out: torch.Tensor | None = None) -> torch.Tensor:
    """y = residual + dropout(x): element i of the flat tensor is kept where draw offset + i of the stream of that
    seed (philox_draws) is >= p, and scaled by 1 / (1 - p). The same (seed, offset) gives the same mask, in the
    backward or on another GPU. An offset that is a multiple of 4 draws four elements per Philox call (the fast
    path)."""
    _check_tensor("dropout_residual_forward", "x", x)
    _check_tensor("dropout_residual_forward", "residual", residual, like=x)
    _check_dropout("dropout_residual_forward", x.numel(), p, seed, offset)
    _, _, out, _, _ = prepare_rows(x, out, "dropout_residual_forward")
    launch(dropout_residual_kernel, (triton.cdiv(x.numel(), DROPOUT_BLOCK),), x, residual, out, x.numel(), float(p),
           int(seed), int(offset), BLOCK=DROPOUT_BLOCK, ALIGNED=_aligned(offset), num_warps=DROPOUT_WARPS)
    return out


def dropout_residual_backward(dy: torch.Tensor, p: float, seed: int, offset: int = 0,
                              out: torch.Tensor | None = None) -> torch.Tensor:
    """dL/dx of y = residual + dropout(x) for upstream gradient dy, the mask regenerated from the forward's
    (seed, offset). dL/dresidual is dy itself."""
    _check_tensor("dropout_residual_backward", "dy", dy)
    _check_dropout("dropout_residual_backward", dy.numel(), p, seed, offset)
    _, _, out, _, _ = prepare_rows(dy, out, "dropout_residual_backward")
    launch(dropout_residual_backward_kernel, (triton.cdiv(dy.numel(), DROPOUT_BLOCK),), dy, out, dy.numel(),
           float(p), int(seed), int(offset), BLOCK=DROPOUT_BLOCK, ALIGNED=_aligned(offset), num_warps=DROPOUT_WARPS)
    return out


def dropout_residual(x: torch.Tensor, residual: torch.Tensor, dy: torch.Tensor, p: float, seed: int,
                     offset: int = 0, out: torch.Tensor | None = None):
    """One training step of y = residual + dropout(x), as the grader runs it: the forward into `out`, then the
    backward for upstream gradient dy with the same (seed, offset). Returns (y, dx)."""
    y = dropout_residual_forward(x, residual, p, seed, offset, out)
    return y, dropout_residual_backward(dy, p, seed, offset)


# ---------------------------------------------------------------- day 4: dropout + residual + LayerNorm; attention epilogues
# ---- day 4 (a): dropout + residual + LayerNorm
NORM_EPS = 1e-5
NORM_MAX_COLS = 65536  # the fused norms hold a whole row in one block
NORM_BACKWARD_STAGES = 3  # the fused backward's row loop pipelined, the next rows' loads started early
ROW_WARP_ELEMENTS = 512  # the fused norms' rows: one warp per 512 elements (16 float32 values per thread and array)


@functools.lru_cache(maxsize=1024)
def _row_launch(n_cols: int, op: str) -> tuple[int, int]:
    """(BLOCK, num_warps) of a one-program-per-row kernel: the whole row in one block, one warp per 512 of its
    elements, 4 to 16 warps. The fused norms keep several float32 copies of the row live (x, r, h, w, b; the backward
    also dy, x̂ and its dweight and dbias sums), so they take more warps than week 34's norms (one per 4 KB): at
    8192 columns 16 warps hold the backward in 128 registers a thread, where 4 warps spill."""
    if n_cols > NORM_MAX_COLS:
        raise ValueError(f"{op}: rows of {n_cols} columns do not fit one block (at most {NORM_MAX_COLS})")
    block = triton.next_power_of_2(n_cols)
    return block, max(4, min(16, block // ROW_WARP_ELEMENTS))


@triton.jit
def dropout_residual_layernorm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, mean_ptr, rstd_ptr, n_cols, p,
                                      seed, offset, eps, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    # One program per row: h = residual + dropout(x), stored (the next layer's residual stream), then
    # y = LayerNorm(h)·w + b from the float32 h still in registers, and the row's mean and rstd (float32, for the
    # backward). Reads 2MN, writes 2MN + 2M; as three ops (dropout, add, norm) the same work moves 7MN and a mask.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    flat = row * n_cols + cols  # the element's index in the flat tensor: it takes draw offset + flat
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + flat, mask=inside, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + flat, mask=inside, other=0.0).to(tl.float32)
    # YOUR CODE HERE


@triton.jit
def dropout_residual_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, rstd_ptr, n_cols, p, seed, offset, eps,
                                    BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    # dropout_residual_layernorm_kernel with RMSNorm (week 34): y = h·rstd·w, rstd = 1 / sqrt(mean(h²) + eps), no
    # mean and no bias. Reads 2MN, writes 2MN + M.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    flat = row * n_cols + cols
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + flat, mask=inside, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + flat, mask=inside, other=0.0).to(tl.float32)
    h = r + dropout_block(x, philox_draws(seed, offset + row * n_cols, BLOCK, ALIGNED), p)
    tl.store(h_ptr + flat, h.to(h_ptr.dtype.element_ty), mask=inside)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    tl.store(y_ptr + flat, (h * rstd * w).to(y_ptr.dtype.element_ty), mask=inside)
    tl.store(rstd_ptr + row, rstd)


def _check_vectors(op: str, x: torch.Tensor, **vectors) -> None:
    """A clear error unless each of `vectors` (weight, bias) is an x.dtype vector of length x.shape[-1]."""
    for name, vector in vectors.items():
        _check_tensor(op, name, vector)
        if vector.shape != (x.shape[-1],) or vector.dtype != x.dtype:
            raise ValueError(f"{op}: {name} must be a {x.dtype} vector of length {x.shape[-1]}; got {vector.dtype} "
                             f"{tuple(vector.shape)}")


def _check_norm(op: str, x, residual, p, seed, offset, **vectors) -> None:
    _check_tensor(op, "x", x)
    _check_tensor(op, "residual", residual, like=x)
    _check_vectors(op, x, **vectors)
    _check_dropout(op, x.numel(), p, seed, offset)


def _row_stats(x: torch.Tensor) -> torch.Tensor:
    """One float32 statistic per row of x (shape x.shape[:-1])."""
    return torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)


def dropout_residual_layernorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                               p: float, seed: int, offset: int = 0, eps: float = NORM_EPS,
                               out: torch.Tensor | None = None):
    """h = residual + dropout(x) and y = LayerNorm(h)·weight + bias over the last dimension, in one pass (the mask
    is dropout_residual's: element i of the flat tensor takes draw offset + i). The norm reads the
    float32 h, before it is rounded for storage. Returns (y, h, mean, rstd); mean and rstd are float32, per row."""
    _check_norm("dropout_residual_layernorm", x, residual, p, seed, offset, weight=weight, bias=bias)
    x2, out2, out, n_rows, n_cols = prepare_rows(x, out, "dropout_residual_layernorm")
    h, mean, rstd = torch.empty_like(x), _row_stats(x), _row_stats(x)
    block, warps = _row_launch(n_cols, "dropout_residual_layernorm")
    launch(dropout_residual_layernorm_kernel, (n_rows,), x2, residual, weight, bias, out2, h, mean, rstd, n_cols,
           float(p), int(seed), int(offset), float(eps), BLOCK=block, ALIGNED=_aligned(offset, n_cols),
           num_warps=warps)
    return out, h, mean, rstd


def dropout_residual_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, p: float, seed: int,
                             offset: int = 0, eps: float = NORM_EPS, out: torch.Tensor | None = None):
    """h = residual + dropout(x) and y = RMSNorm(h)·weight in one pass. Returns (y, h, rstd)."""
    _check_norm("dropout_residual_rmsnorm", x, residual, p, seed, offset, weight=weight)
    x2, out2, out, n_rows, n_cols = prepare_rows(x, out, "dropout_residual_rmsnorm")
    h, rstd = torch.empty_like(x), _row_stats(x)
    block, warps = _row_launch(n_cols, "dropout_residual_rmsnorm")
    launch(dropout_residual_rmsnorm_kernel, (n_rows,), x2, residual, weight, out2, h, rstd, n_cols, float(p),
           int(seed), int(offset), float(eps), BLOCK=block, ALIGNED=_aligned(offset, n_cols), num_warps=warps)
    return out, h, rstd


@triton.jit
def dropout_residual_layernorm_backward_kernel(dy_ptr, dh_ptr, h_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dr_ptr,
                                               part_ptr, n_rows, n_cols, rows_per_program, p, seed, offset,
                                               BLOCK: tl.constexpr, HAS_DH: tl.constexpr, ALIGNED: tl.constexpr,
                                               STAGES: tl.constexpr):
    # Program q owns rows [q·R, q·R + R). Per row: the gradient reaching h is the norm's dx (week 34's formula,
    # from the stored h, mean and rstd) plus dh, the gradient h receives as the residual stream; that is the
    # residual's gradient, and through the mask drawn again x's. dy·x̂ and dy add into the program's partial rows
    # of dweight and dbias, summed over programs afterwards. Reads 2MN (+ MN for dh), writes 2MN + 2·P·N.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], tl.float32)
    db = tl.zeros([BLOCK], tl.float32)
    first = pid * rows_per_program
    for k in tl.range(0, tl.minimum(rows_per_program, n_rows - first), num_stages=STAGES):  # next row loads early
        row = (first + k).to(tl.int64)
        flat = row * n_cols + cols
        dy = tl.load(dy_ptr + flat, mask=inside, other=0.0).to(tl.float32)
        h = tl.load(h_ptr + flat, mask=inside, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        xhat = tl.where(inside, (h - tl.load(mean_ptr + row)) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / n_cols
        c2 = tl.sum(wdy, axis=0) / n_cols
        dh = (wdy - (xhat * c1 + c2)) * rstd
        if HAS_DH:
            dh += tl.load(dh_ptr + flat, mask=inside, other=0.0).to(tl.float32)
        tl.store(dr_ptr + flat, dh.to(dr_ptr.dtype.element_ty), mask=inside)
        dx = dropout_block(dh, philox_draws(seed, offset + row * n_cols, BLOCK, ALIGNED), p)  # the forward's mask
        tl.store(dx_ptr + flat, dx.to(dx_ptr.dtype.element_ty), mask=inside)
        dw += dy * xhat
        db += dy
    tl.store(part_ptr + pid * 2 * n_cols + cols, dw, mask=inside)
    tl.store(part_ptr + pid * 2 * n_cols + n_cols + cols, db, mask=inside)


@functools.cache
def _programs(device: torch.device, warps: int) -> int:
    """Programs of a row-loop kernel of `warps` warps: as many as fit on the GPU at once (two per SM, one where a
    program has 16 warps and about 120 registers a thread), 3 on CPU (so the partial rows still need summing)."""
    return (2 if warps < 16 else 1) * torch.cuda.get_device_properties(device).multi_processor_count if ON_GPU else 3


def dropout_residual_layernorm_backward(dy: torch.Tensor, h: torch.Tensor, weight: torch.Tensor,
                                        mean: torch.Tensor, rstd: torch.Tensor, p: float, seed: int, offset: int = 0,
                                        dh: torch.Tensor | None = None):
    """Gradients of (y, h) = dropout_residual_layernorm(x, residual, weight, bias, p, seed, offset) for upstream
    gradients dy (of y) and dh (of h, the residual stream; None for none), from the saved h, mean and rstd and the
    mask drawn again. Returns (dx, dresidual, dweight, dbias)."""
    op = "dropout_residual_layernorm_backward"
    _check_tensor(op, "h", h)
    _check_tensor(op, "dy", dy, like=h)
    if dh is not None:
        _check_tensor(op, "dh", dh, like=h)
    _check_vectors(op, h, weight=weight)
    _check_dropout(op, h.numel(), p, seed, offset)
    n_cols = h.shape[-1]
    n_rows = h.numel() // n_cols
    for name, stat in (("mean", mean), ("rstd", rstd)):
        if not isinstance(stat, torch.Tensor) or stat.numel() != n_rows or stat.dtype != torch.float32:
            raise ValueError(f"{op}: {name} must hold one float32 value per row ({n_rows}), as the forward saved it")
    block, warps = _row_launch(n_cols, op)
    rows_per_program = triton.cdiv(n_rows, min(_programs(h.device, warps), n_rows))
    n_parts = triton.cdiv(n_rows, rows_per_program)
    dx, dresidual = torch.empty_like(h), torch.empty_like(h)
    parts = torch.empty((n_parts, 2 * n_cols), dtype=torch.float32, device=h.device)
    launch(dropout_residual_layernorm_backward_kernel, (n_parts,), dy, h if dh is None else dh, h, weight,
           mean.contiguous(), rstd.contiguous(), dx, dresidual, parts, n_rows, n_cols, rows_per_program, float(p),
           int(seed), int(offset), BLOCK=block, HAS_DH=dh is not None, ALIGNED=_aligned(offset, n_cols),
           STAGES=NORM_BACKWARD_STAGES, num_warps=warps)
    sums = parts.sum(dim=0).to(weight.dtype)  # stage 2 (week 34's weight_grad_kernel does it in Triton)
    return dx, dresidual, sums[:n_cols], sums[n_cols:]


class DropoutResidualLayerNorm(torch.autograd.Function):
    """h = residual + dropout(x), y = LayerNorm(h)·weight + bias with the fused kernels, both outputs differentiable:
    `y, h = DropoutResidualLayerNorm.apply(x, residual, weight, bias, p, seed, offset, eps)`. Only (seed, offset) is
    kept for the backward, which draws the mask again."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, p, seed, offset=0, eps=NORM_EPS):
        y, h, mean, rstd = dropout_residual_layernorm(x.contiguous(), residual.contiguous(), weight, bias, p, seed,
                                                      offset, eps)
        ctx.save_for_backward(h, weight, mean, rstd)
        ctx.dropout = (p, seed, offset)
        return y, h

    @staticmethod
    def backward(ctx, dy, dh):
        h, weight, mean, rstd = ctx.saved_tensors
        dx, dresidual, dweight, dbias = dropout_residual_layernorm_backward(
            dy.contiguous(), h, weight, mean, rstd, *ctx.dropout, dh=None if dh is None else dh.contiguous())
        return dx, dresidual, dweight, dbias, None, None, None, None


# ---- day 4 (b): attention epilogues
# The attention kernels of the week work in base 2: exp2 is a GPU's fast exponential and exp(x) = exp2(x·log2 e), so
# the softmax scale and log2(e) travel as one factor, qk_scale = scale·log2(e). That is the fused scaling: no pass
# scales S, and each kernel puts the factor where it costs least (on every score, or once on the query tile).
from course.heads import as_heads, on_device, slopes_tensor  # noqa: E402

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e); a constexpr, so kernels read it (the host: LOG2E.value)
ATTENTION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def attention_tiles(d: int) -> tuple:
    """(BLOCK_M, BLOCK_N, num_warps, STAGES) of the week's attention kernels for head dimension d: a GPU's tiles, or
    the interpreter's small ones (no smaller than 16, as tl.dot needs on a GPU)."""
    if not ON_GPU:
        return 32, 16, 4, 1
    return (128, 64, 8, 3) if d > 32 else (64, 64, 4, 2)


def _attention_inputs(op: str, q, k, v, scale):
    """q, k, v as (B, H, length, d) tensors with a contiguous last dimension, checked against each other, and the
    softmax scale (1/√d by default)."""
    q, k, v = (as_heads(t, op, name) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    (bsz, heads, _, d), n = q.shape, k.shape[2]
    if k.shape != (bsz, heads, n, d) or v.shape != k.shape or not q.dtype == k.dtype == v.dtype \
            or not q.device == k.device == v.device:
        raise ValueError(f"{op}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} must share batch, "
                         f"heads, head_dim, dtype and device; k and v must have the same shape")
    if q.dtype not in ATTENTION_DTYPES or d > 256:
        raise ValueError(f"{op}: q, k, v must be float16, bfloat16 or float32 with head_dim at most 256; got "
                         f"{q.dtype}, head_dim {d}")
    return q, k, v, 1 / math.sqrt(d) if scale is None else float(scale)


# tl.dot's input precision: a float32 product stays float32 on a GPU, whose default (TF32) keeps 10 bits of each
# operand; the 16-bit products the kernels use on 16-bit inputs are exact either way.
DOT_PRECISION = "ieee"


@triton.jit
def _key_range(pid_m, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # The keys of query block pid_m: the blocks in [0, free) need no mask, [free, stop) do (the diagonal, the tail);
    # with a causal mask no key after the block's last query is loaded.
    if CAUSAL:
        free = tl.minimum(pid_m * BLOCK_M, N) // BLOCK_N * BLOCK_N
        stop = tl.minimum((pid_m + 1) * BLOCK_M, N)
    else:
        free = N // BLOCK_N * BLOCK_N
        stop = N
    return free, stop


@triton.jit
def _masked(s, rows, cols, N, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    # -inf for the keys past N and (causal) the keys after their query; blocks that need no mask skip the compares
    if MASKED:
        keep = cols[None, :] < N
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        s = tl.where(keep, s, -float("inf"))
    return s


@triton.jit
def _softmax_tile(s, m_i, l_i):
    # One tile of the online softmax over base-2 logits s (-inf where masked): the tile's probabilities against the
    # new running max, alpha = 2^(m_old − m_new) that rescales what was summed before, and the new max and sum.
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # a row with no key yet: exp2(-inf - 0) = 0, never NaN
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _log_sum_exp(m_i, l_i):
    # the natural log of each row's Σ exp(scores), from its base-2 running max and sum; -inf for a row with no key
    return tl.where(l_i > 0, (m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0))) / LOG2E, -float("inf"))


@triton.jit
def _attend_keys(acc, m_i, l_i, q, k_head, v_head, rows, dims, start, stop, N, D, skn, svn, qk_scale, slope,
                 BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, ALIBI: tl.constexpr,
                 STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # The key blocks [start, stop) of one query tile q (BLOCK_M, BLOCK_D): S = Q Kᵀ with the scale folded into
    # exp2's argument (one multiply per score), ALiBi's -slope·|i - j| made from the indices (slope in base 2), the
    # online softmax, and P V added to the rescaled accumulator.
    for begin in tl.range(start, stop, BLOCK_N, num_stages=STAGES):
        cols = begin + tl.arange(0, BLOCK_N)
        k_t = tl.load(k_head + cols[None, :] * skn + dims[:, None], mask=(cols[None, :] < N) & (dims[:, None] < D),
                      other=0.0)
        s = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale
        if ALIBI:
            s -= slope * tl.abs(rows[:, None] - cols[None, :]).to(tl.float32)
        p, alpha, m_i, l_i = _softmax_tile(_masked(s, rows, cols, N, MASKED, CAUSAL), m_i, l_i)
        v = tl.load(v_head + cols[:, None] * svn + dims[None, :], mask=(cols[:, None] < N) & (dims[None, :] < D),
                    other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_i, l_i


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, slopes_ptr, o_ptr, lse_ptr, M, N, D, H, qk_scale,
                     sqb, sqh, sqm, skb, skh, skn, svb, svh, svn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                     ALIBI: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # Program (query block, b·H + h) keeps BLOCK_M queries on chip while the key and value blocks stream past: reads
    # Q once and K, V once per query block (causal: up to the diagonal), writes O (contiguous) and the LSE (float32,
    # (B·H, M)). ALiBi's bias is made per tile from head h's slope: no (M, N) bias exists anywhere.
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + b.to(tl.int64) * sqb + h * sqh + rows[:, None] * sqm + dims[None, :],
                mask=(rows[:, None] < M) & (dims[None, :] < D), other=0.0)
    slope = 0.0
    if ALIBI:
        slope = tl.load(slopes_ptr + h) * LOG2E
    k_head = k_ptr + b.to(tl.int64) * skb + h * skh
    v_head = v_ptr + b.to(tl.int64) * svb + h * svh
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    free, stop = _key_range(pid_m, N, BLOCK_M, BLOCK_N, CAUSAL)
    acc, m_i, l_i = _attend_keys(acc, m_i, l_i, q, k_head, v_head, rows, dims, 0, free, N, D, skn, svn, qk_scale,
                                 slope, BLOCK_N, False, CAUSAL, ALIBI, STAGES, PRECISION)
    acc, m_i, l_i = _attend_keys(acc, m_i, l_i, q, k_head, v_head, rows, dims, free, stop, N, D, skn, svn, qk_scale,
                                 slope, BLOCK_N, True, CAUSAL, ALIBI, STAGES, PRECISION)
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_rows = o_ptr + bh.to(tl.int64) * M * D + rows[:, None] * D + dims[None, :]
    tl.store(o_rows, o.to(o_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (dims[None, :] < D))
    tl.store(lse_ptr + bh.to(tl.int64) * M + rows, _log_sum_exp(m_i, l_i), mask=rows < M)


def _attention(op: str, q, k, v, causal: bool, scale, slopes=None):
    q, k, v, scale = _attention_inputs(op, q, k, v, scale)
    (bsz, heads, m, d), n = q.shape, k.shape[2]
    if slopes is not None:
        slopes = slopes_tensor(slopes, heads, q, op)
    block_m, block_n, warps, stages = attention_tiles(d)
    o = torch.empty((bsz, heads, m, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((bsz, heads, m), dtype=torch.float32, device=q.device)
    attention_kernel[(triton.cdiv(m, block_m), bsz * heads)](
        q, k, v, lse if slopes is None else slopes, o, lse, m, n, d, heads, scale * LOG2E.value, *q.stride()[:3],
        *k.stride()[:3], *v.stride()[:3], BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
        CAUSAL=bool(causal), ALIBI=slopes is not None, STAGES=stages, PRECISION=DOT_PRECISION, num_warps=warps)
    return o, lse


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale=None):
    """softmax(scale · q kᵀ, causal or not) v with this week's kernel: (o, lse), o (B, H, M, d) in q's dtype and lse
    (B, H, M) float32, the natural log of each row's Σ exp(scale · q·k). The baseline the fused kernels are measured
    against; its scaling is fused already, riding in exp2's argument as qk_scale = scale·log2(e)."""
    return _attention("flash_attention", q, k, v, causal, scale)


@triton.jit
def attention_output_projection_kernel(q_ptr, k_ptr, v_ptr, w_ptr, b_ptr, y_ptr, M, N, D, H, C, qk_scale,
                                       sqb, sqh, sqm, skb, skh, skn, svb, svh, svn,
                                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                                       BLOCK_C: tl.constexpr, CAUSAL: tl.constexpr, HAS_BIAS: tl.constexpr,
                                       STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # Program (query block, block of BLOCK_C output columns, batch entry b) runs attention for every head h of its
    # queries and adds o_h · W_O[cols, h·d : (h+1)·d]ᵀ into a (BLOCK_M, BLOCK_C) accumulator: O never reaches memory.
    # Reads Q, K, V once per column block (each one recomputes every head) and W_O once per query block; writes Y.
    pid_m, pid_c, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    outs = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    free, stop = _key_range(pid_m, N, BLOCK_M, BLOCK_N, CAUSAL)
    y = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)
    for h in range(0, H):
        q = tl.load(q_ptr + b.to(tl.int64) * sqb + h * sqh + rows[:, None] * sqm + dims[None, :],
                    mask=(rows[:, None] < M) & (dims[None, :] < D), other=0.0)
        k_head = k_ptr + b.to(tl.int64) * skb + h * skh
        v_head = v_ptr + b.to(tl.int64) * svb + h * svh
        m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        acc, m_i, l_i = _attend_keys(acc, m_i, l_i, q, k_head, v_head, rows, dims, 0, free, N, D, skn, svn,
                                     qk_scale, 0.0, BLOCK_N, False, CAUSAL, False, STAGES, PRECISION)
        acc, m_i, l_i = _attend_keys(acc, m_i, l_i, q, k_head, v_head, rows, dims, free, stop, N, D, skn, svn,
                                     qk_scale, 0.0, BLOCK_N, True, CAUSAL, False, STAGES, PRECISION)
        o = (acc / tl.where(l_i > 0, l_i, 1.0)[:, None]).to(q.dtype)  # rounded as a stored O would be
        w_t = tl.load(w_ptr + outs[None, :] * (H * D) + h * D + dims[:, None],
                      mask=(outs[None, :] < C) & (dims[:, None] < D), other=0.0)
        y = tl.dot(o, w_t, y, input_precision=PRECISION)
    if HAS_BIAS:
        y += tl.load(b_ptr + outs, mask=outs < C, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + (b.to(tl.int64) * M + rows[:, None]) * C + outs[None, :], y.to(y_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (outs[None, :] < C))


def attention_output_projection(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w_o: torch.Tensor,
                                b_o: torch.Tensor | None = None, causal: bool = False, scale=None) -> torch.Tensor:
    """Multi-head attention's output, projected, in one kernel: y = concat_h(softmax(scale · q_h k_hᵀ) v_h) · W_Oᵀ
    (+ b_o), y (B, M, C) in q's dtype; w_o (C, H·d) as nn.Linear holds it, b_o (C,) or None.

    The product O·W_Oᵀ is the attention's epilogue, so O (B·M·H·d elements) is neither written nor read back. The
    price: a program owns BLOCK_C output columns and needs every head for them, so the attention of every head runs
    ceil(C / BLOCK_C) times (4 times for C = 512 on a GPU, 8 for C = 1024), each time reading K and V again. Expected
    cost: about ceil(C / BLOCK_C) × the attention's time plus the GEMM's, against attention + GEMM + one O round trip;
    fusion pays only where C fits one or two column blocks (course.w39_kernel_fusion.reference.output_projection_cost
    counts both)."""
    q, k, v, scale = _attention_inputs("attention_output_projection", q, k, v, scale)
    (bsz, heads, m, d), n = q.shape, k.shape[2]
    if not isinstance(w_o, torch.Tensor) or w_o.dim() != 2 or w_o.shape[1] != heads * d or w_o.dtype != q.dtype:
        raise ValueError(f"attention_output_projection: w_o must be a {q.dtype} (C, H·d = {heads * d}) tensor; got "
                         f"{getattr(w_o, 'dtype', type(w_o).__name__)} {tuple(getattr(w_o, 'shape', ()))}")
    on_device(w_o, "attention_output_projection", "w_o")
    c = w_o.shape[0]
    if b_o is not None and (not isinstance(b_o, torch.Tensor) or b_o.shape != (c,) or b_o.device != q.device):
        raise ValueError(f"attention_output_projection: b_o must be a ({c},) tensor on {q.device} or None")
    block_m, block_n, warps, stages = (64, 64, 8, 2) if ON_GPU else (32, 16, 4, 1)
    block_c = min(128 if ON_GPU else 64, max(16, triton.next_power_of_2(c)))
    y = torch.empty((bsz, m, c), dtype=q.dtype, device=q.device)
    attention_output_projection_kernel[(triton.cdiv(m, block_m), triton.cdiv(c, block_c), bsz)](
        q, k, v, w_o.contiguous(), y if b_o is None else b_o, y, m, n, d, heads, c, scale * LOG2E.value,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_C=block_c, CAUSAL=bool(causal), HAS_BIAS=b_o is not None,
        STAGES=stages, PRECISION=DOT_PRECISION, num_warps=warps)
    return y


# ---------------------------------------------------------------- day 5: RoPE and ALiBi inside attention; QKV projection
# RoPE (Su et al., 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding") in week 35's "rotate half"
# layout: position t turns the pair (x_c, x_{c + d/2}) by the angle of row t of the (positions, d/2) cos and sin
# tables. Rotating as the tiles are loaded saves the rotary pass's round trip of q and k through memory.
def _tables(op: str, cos, sin, length: int, d: int):
    """cos and sin, contiguous, checked to be (>= length, d/2) float tables on the kernels' device."""
    if d % 2:
        raise ValueError(f"{op}: RoPE needs an even head_dim; got {d}")
    for name, table in (("cos", cos), ("sin", sin)):
        if not isinstance(table, torch.Tensor) or table.dim() != 2 or table.shape[0] < length \
                or table.shape[1] != d // 2 or not table.is_floating_point():
            raise ValueError(f"{op}: {name} must be a float tensor of shape (at least {length}, {d // 2}); got "
                             f"{getattr(table, 'dtype', type(table).__name__)} {tuple(getattr(table, 'shape', ()))}")
        on_device(table, op, name)
    return cos.contiguous(), sin.contiguous()


@triton.jit
def rotate_half_tile(row_ptrs, pos, c, mask, cos_ptr, sin_ptr, HALF):
    # Loads a tile of rows (BLOCK, d) and returns its two halves rotated, in float32: row r (pointer row_ptrs[r],
    # position pos[r]) turns each pair (x_c, x_{c + d/2}) by row pos[r] of the (positions, HALF) tables.
    # c: the pair indices 0 … BLOCK_HALF - 1; mask: the rows and pairs that exist.
    # YOUR CODE HERE
    return y1, y2


@triton.jit
def _attend_rotated_keys(acc1, acc2, m_i, l_i, q1, q2, k_head, v_head, cos_ptr, sin_ptr, rows, c, start, stop, N,
                         HALF, skn, svn, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                         STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # The key blocks [start, stop) of one query tile held as its rotated, pre-scaled halves q1, q2: each key tile is
    # rotated as it arrives, S = q1·k1ᵀ + q2·k2ᵀ is already in base 2, and O = [P·v1, P·v2] is kept as two halves.
    for begin in tl.range(start, stop, BLOCK_N, num_stages=STAGES):
        cols = begin + tl.arange(0, BLOCK_N)
        inside = (cols[:, None] < N) & (c[None, :] < HALF)
        # s: this key tile's scores q1·k1ᵀ + q2·k2ᵀ, k1 and k2 its halves rotated at the keys' positions (cols)
        # YOUR CODE HERE
        p, alpha, m_i, l_i = _softmax_tile(_masked(s, rows, cols, N, MASKED, CAUSAL), m_i, l_i)
        v_rows = v_head + cols[:, None] * svn
        v1 = tl.load(v_rows + c[None, :], mask=inside, other=0.0)
        v2 = tl.load(v_rows + HALF + c[None, :], mask=inside, other=0.0)
        acc1 = acc1 * alpha[:, None] + tl.dot(p.to(v1.dtype), v1, input_precision=PRECISION)
        acc2 = acc2 * alpha[:, None] + tl.dot(p.to(v2.dtype), v2, input_precision=PRECISION)
    return acc1, acc2, m_i, l_i


@triton.jit
def rope_attention_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, o_ptr, lse_ptr, M, N, HALF, H, qk_scale,
                          sqb, sqh, sqm, skb, skh, skn, svb, svh, svn,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_HALF: tl.constexpr,
                          CAUSAL: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr):
    # attention_kernel's program (query block, b·H + h), RoPE applied as tiles are loaded: the query tile rotated
    # once (the prologue, which also folds in qk_scale), each key tile as it arrives. Reads and writes what
    # attention_kernel does, plus the table rows of the positions it loads; nothing rotated reaches memory.
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_HALF)
    q_rows = q_ptr + b.to(tl.int64) * sqb + h * sqh + rows[:, None] * sqm
    # The prologue: q1, q2, the query tile's halves rotated at the queries' positions (rows) and multiplied by
    # qk_scale, stored in q's dtype as the operands of the dots
    # YOUR CODE HERE
    k_head = k_ptr + b.to(tl.int64) * skb + h * skh
    v_head = v_ptr + b.to(tl.int64) * svb + h * svh
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_HALF], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_HALF], tl.float32)
    free, stop = _key_range(pid_m, N, BLOCK_M, BLOCK_N, CAUSAL)
    acc1, acc2, m_i, l_i = _attend_rotated_keys(acc1, acc2, m_i, l_i, q1, q2, k_head, v_head, cos_ptr, sin_ptr, rows,
                                                c, 0, free, N, HALF, skn, svn, BLOCK_N, False, CAUSAL, STAGES,
                                                PRECISION)
    acc1, acc2, m_i, l_i = _attend_rotated_keys(acc1, acc2, m_i, l_i, q1, q2, k_head, v_head, cos_ptr, sin_ptr, rows,
                                                c, free, stop, N, HALF, skn, svn, BLOCK_N, True, CAUSAL, STAGES,
                                                PRECISION)
    l_safe = tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_rows = o_ptr + bh.to(tl.int64) * M * 2 * HALF + rows[:, None] * 2 * HALF + c[None, :]
    inside = (rows[:, None] < M) & (c[None, :] < HALF)
    tl.store(o_rows, (acc1 / l_safe).to(o_ptr.dtype.element_ty), mask=inside)
    tl.store(o_rows + HALF, (acc2 / l_safe).to(o_ptr.dtype.element_ty), mask=inside)
    tl.store(lse_ptr + bh.to(tl.int64) * M + rows, _log_sum_exp(m_i, l_i), mask=rows < M)


def rope_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   causal: bool = False, scale=None):
    """Attention on q and k rotated by RoPE inside the kernel: (o, lse) as flash_attention returns them. cos and
    sin are (>= max(M, N), d/2) tables of positions 0, 1, … (week 35's rope_tables): query i takes row i, key j
    row j. No rotated q or k is ever written: the rotation happens on chip, as each tile is loaded."""
    q, k, v, scale = _attention_inputs("rope_attention", q, k, v, scale)
    (bsz, heads, m, d), n = q.shape, k.shape[2]
    cos, sin = _tables("rope_attention", cos, sin, max(m, n), d)
    block_m, block_n, warps, stages = attention_tiles(d)
    o = torch.empty((bsz, heads, m, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((bsz, heads, m), dtype=torch.float32, device=q.device)
    rope_attention_kernel[(triton.cdiv(m, block_m), bsz * heads)](
        q, k, v, cos, sin, o, lse, m, n, d // 2, heads, scale * LOG2E.value, *q.stride()[:3], *k.stride()[:3],
        *v.stride()[:3], BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_HALF=max(16, triton.next_power_of_2(d // 2)),
        CAUSAL=bool(causal), STAGES=stages, PRECISION=DOT_PRECISION, num_warps=warps)
    return o, lse


def alibi_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes, causal: bool = False, scale=None):
    """Attention with ALiBi (Press et al., 2022, "Train Short, Test Long"): score + (-slopes[h]·|i - j|), the bias made
    inside the kernel from the (H,) slopes and the indices, never an (M, N) tensor. (o, lse) as flash_attention."""
    if slopes is None:
        raise ValueError("alibi_attention: slopes must hold one value per head (week 35's alibi_slopes(H))")
    return _attention("alibi_attention", q, k, v, causal, scale, slopes)


@triton.jit
def qkv_rope_projection_kernel(x_ptr, w_ptr, b_ptr, cos_ptr, sin_ptr, qkv_ptr, T, N, C, H, HALF,
                               BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, HEADS: tl.constexpr,
                               BLOCK_HALF: tl.constexpr, HAS_BIAS: tl.constexpr, STAGES: tl.constexpr,
                               PRECISION: tl.constexpr):
    # Program (block of BLOCK_M tokens, group of HEADS head slots of the 3H: the q heads, then k, then v) computes
    # its heads of x·W_QKVᵀ as two accumulators, the first halves of its heads side by side and their second halves;
    # the epilogue adds the bias and turns each pair (c, c + d/2) of a q or k head by its token's position in the
    # sequence (a v head takes cos = 1, sin = 0). Reads x once per group and W_QKV once per token block; writes q, k,
    # v once into (B·N, 3, H, d): no rotary pass reads them back.
    pid_m, pid_g = tl.program_id(0), tl.program_id(1)
    tokens = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    e = tl.arange(0, HEADS * BLOCK_HALF)
    slot, c = pid_g * HEADS + e // BLOCK_HALF, e % BLOCK_HALF  # each column's head slot and pair
    col = slot * 2 * HALF + c  # its row of W_QKV and column of the output (the first half; + HALF the second)
    real = (c < HALF) & (slot < 3 * H)
    ks = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + tokens[:, None].to(tl.int64) * C
    acc1 = tl.zeros([BLOCK_M, HEADS * BLOCK_HALF], tl.float32)
    acc2 = tl.zeros([BLOCK_M, HEADS * BLOCK_HALF], tl.float32)
    for k0 in tl.range(0, C, BLOCK_K, num_stages=STAGES):
        kk = k0 + ks
        x = tl.load(x_rows + kk[None, :], mask=(tokens[:, None] < T) & (kk[None, :] < C), other=0.0)
        w_cols = w_ptr + col[None, :] * C + kk[:, None]  # W_QKV's rows, as the columns of a (BLOCK_K, ·) tile
        w_mask = (kk[:, None] < C) & real[None, :]
        acc1 = tl.dot(x, tl.load(w_cols, mask=w_mask, other=0.0), acc1, input_precision=PRECISION)
        acc2 = tl.dot(x, tl.load(w_cols + HALF * C, mask=w_mask, other=0.0), acc2, input_precision=PRECISION)
    if HAS_BIAS:
        acc1 += tl.load(b_ptr + col, mask=real, other=0.0).to(tl.float32)[None, :]
        acc2 += tl.load(b_ptr + col + HALF, mask=real, other=0.0).to(tl.float32)[None, :]
    inside = (tokens[:, None] < T) & real[None, :]
    turned = inside & (slot < 2 * H)[None, :]  # q and k heads: RoPE at each token's position in its own sequence
    angle = (tokens % N)[:, None] * HALF + c[None, :]
    cos = tl.load(cos_ptr + angle, mask=turned, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + angle, mask=turned, other=0.0).to(tl.float32)
    out = qkv_ptr + tokens[:, None].to(tl.int64) * (3 * H * 2 * HALF) + col[None, :]
    tl.store(out, (acc1 * cos - acc2 * sin).to(qkv_ptr.dtype.element_ty), mask=inside)
    tl.store(out + HALF, (acc2 * cos + acc1 * sin).to(qkv_ptr.dtype.element_ty), mask=inside)


def qkv_rope_projection(x: torch.Tensor, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None, cos: torch.Tensor,
                        sin: torch.Tensor, n_heads: int):
    """q, k, v of multi-head attention from one GEMM with RoPE in its epilogue: x (B, N, C) times the stacked weights
    w_qkv (3C, C) (plus b_qkv (3C,) or None) gives (B, N, 3, H, d), returned as three (B, H, N, d) views (strided, no
    copy), q and k rotated at positions 0 … N - 1 by the (>= N, d/2) tables. Week 35's qkv_projection and rope do it
    in two passes; the other full fusion is this GEMM without RoPE, then rope_attention."""
    op = "qkv_rope_projection"
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.numel() == 0:
        raise ValueError(f"{op}: x must be a (batch, length, C) tensor; got {tuple(getattr(x, 'shape', ()))}")
    on_device(x, op, "x")
    bsz, n, c = x.shape
    if c % n_heads or not isinstance(w_qkv, torch.Tensor) or w_qkv.shape != (3 * c, c) or w_qkv.dtype != x.dtype \
            or x.dtype not in ATTENTION_DTYPES:
        raise ValueError(f"{op}: need a float16, bfloat16 or float32 x, w_qkv of shape {(3 * c, c)} in x's dtype, "
                         f"and C = {c} divisible by n_heads = {n_heads}; got {getattr(w_qkv, 'dtype', None)} "
                         f"{tuple(getattr(w_qkv, 'shape', ()))}")
    on_device(w_qkv, op, "w_qkv")
    if b_qkv is not None and (not isinstance(b_qkv, torch.Tensor) or b_qkv.shape != (3 * c,)
                              or b_qkv.device != x.device):
        raise ValueError(f"{op}: b_qkv must be a ({3 * c},) tensor on {x.device} or None")
    d = c // n_heads
    cos, sin = _tables(op, cos, sin, n, d)
    block_half = max(16, triton.next_power_of_2(d // 2))
    # a GEMM's tile: 128 tokens × 128 columns (two accumulators of 64) on a GPU; small tiles, two heads, on CPU
    block_m, block_k, heads, warps, stages = (128, 64, max(1, 64 // block_half), 8, 3) if ON_GPU else (32, 32, 2, 4, 1)
    qkv = torch.empty((bsz, n, 3, n_heads, d), dtype=x.dtype, device=x.device)
    qkv_rope_projection_kernel[(triton.cdiv(bsz * n, block_m), triton.cdiv(3 * n_heads, heads))](
        x.contiguous(), w_qkv.contiguous(), qkv if b_qkv is None else b_qkv, cos, sin, qkv, bsz * n, n, c, n_heads,
        d // 2, BLOCK_M=block_m, BLOCK_K=block_k, HEADS=heads, BLOCK_HALF=block_half, HAS_BIAS=b_qkv is not None,
        STAGES=stages, PRECISION=DOT_PRECISION, num_warps=warps)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    return q, k, v
