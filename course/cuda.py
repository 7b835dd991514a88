"""CUDA C kernels: compiled with NVRTC everywhere (no driver needed), run through CuPy on a GPU.

Owns: the dtype prelude every course kernel is compiled with, the resource report
(registers, shared memory, spills) and the launch of a templated kernel on torch tensors.
Kernels are templates over the storage type `T` (float, half_t, bf16_t) and compute in float.
"""
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .backend import ON_GPU

# 16-bit storage types and conversions written with PTX, so no CUDA header is needed.
PRELUDE = r"""
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
struct half_t { unsigned short bits; };
struct bf16_t { unsigned short bits; };
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(half_t v) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits)); return f; }
__device__ __forceinline__ float to_float(bf16_t v) { return __uint_as_float(((unsigned)v.bits) << 16); }
template <typename T> __device__ __forceinline__ T from_float(float f);
template <> __device__ __forceinline__ float from_float<float>(float f) { return f; }
template <> __device__ __forceinline__ half_t from_float<half_t>(float f) {
    half_t h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f)); return h; }
template <> __device__ __forceinline__ bf16_t from_float<bf16_t>(float f) {
    bf16_t h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f)); return h; }
"""
PRELUDE_LINES = PRELUDE.count("\n")

CUDA_TYPES = {"float32": "float", "float16": "half_t", "bfloat16": "bf16_t"}
ARCH = "sm_90"  # the lent GPUs are Hopper; NVRTC compiles for it without a driver
OPTIONS = ("-std=c++17", "-lineinfo")


class CudaCompileError(AssertionError):
    """The learner's CUDA C did not compile; the message is the compiler log, with line numbers
    counted in the learner's source (the prelude is subtracted)."""

    def _render_traceback_(self):  # IPython: show the log, not our frames
        return [f"CudaCompileError: {self}"]


class NeedsGPU(Exception):
    """Raised instead of running a CuPy kernel on a machine without a GPU."""


@dataclass
class Resources:
    kernel: str
    registers: int
    shared_bytes: int
    spill_bytes: int
    stack_bytes: int

    def __str__(self):
        return (f"{self.kernel}: {self.registers} registers/thread, {self.shared_bytes} B static shared, "
                f"{self.stack_bytes} B stack, {self.spill_bytes} B spilled")


def _fix_line_numbers(log: str, name: str) -> str:
    return re.sub(rf"{re.escape(name)}\((\d+)\)",
                  lambda m: f"{name}({int(m.group(1)) - PRELUDE_LINES})", log)


def nvrtc_status() -> str:
    try:
        from cuda.bindings import nvrtc
        _, major, minor = nvrtc.nvrtcVersion()
        return f"NVRTC {major}.{minor} (compiles for {ARCH} with no GPU)"
    except Exception as exc:  # noqa: BLE001 - reported by doctor
        return f"missing ({exc.__class__.__name__}: install cuda-bindings and nvidia-cuda-nvrtc)"


def cupy_ok() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


@lru_cache(maxsize=64)
def compile_report(source: str, kernel: str, dtypes: tuple[str, ...] = tuple(CUDA_TYPES)) -> tuple[Resources, ...]:
    """Compile `source` with NVRTC for each dtype; return ptxas's resource report per instantiation.
    Raises CudaCompileError with the log on failure."""
    from cuda.bindings import nvrtc
    name = f"{kernel}.cu"
    _, prog = nvrtc.nvrtcCreateProgram((PRELUDE + source).encode(), name.encode(), 0, [], [])
    exprs = [f"{kernel}<{CUDA_TYPES[d]}>" for d in dtypes]
    for expr in exprs:
        nvrtc.nvrtcAddNameExpression(prog, expr.encode())
    opts = [f"--gpu-architecture={ARCH}".encode(), b"-Xptxas=-v", *(o.encode() for o in OPTIONS)]
    (status,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    log = _fix_line_numbers(buf.decode(errors="replace").strip("\x00 \n"), name)
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CudaCompileError(f"{kernel} did not compile:\n{log}")
    lowered = {nvrtc.nvrtcGetLoweredName(prog, e.encode())[1].decode(): e for e in exprs}
    nvrtc.nvrtcDestroyProgram(prog)
    return tuple(_parse_ptxas(log, lowered))


def _parse_ptxas(log: str, lowered: dict[str, str]):
    for section in log.split("Compiling entry function '")[1:]:
        mangled = section.split("'", 1)[0]

        def number(pattern):
            match = re.search(pattern, section)
            return int(match.group(1)) if match else 0
        yield Resources(lowered.get(mangled, mangled), number(r"Used (\d+) registers"),
                        number(r"(\d+) bytes smem"), number(r"(\d+) bytes spill stores"),
                        number(r"(\d+) bytes stack frame"))


class CudaKernel:
    """One templated `__global__` function: `CudaKernel(SRC, "block_softmax")(grid, block, x, y, n)`.

    Tensor arguments are passed as device pointers, ints as int32, floats as float32. The storage
    type T is taken from the first tensor argument."""

    def __init__(self, source: str, name: str):
        self.source, self.name = source, name
        self._ready = {}  # dtype -> the loaded function, once compiled and checked (the per-call path skips both)

    def report(self, dtypes: tuple[str, ...] = tuple(CUDA_TYPES)) -> tuple[Resources, ...]:
        return compile_report(self.source, self.name, dtypes)

    def __call__(self, grid, block, *args, shared_bytes: int = 0):
        import torch
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        dtype = tensors[0].dtype
        func = self._ready.get(dtype) or self._load(dtype)
        for t in tensors:
            if not t.is_cuda:
                raise ValueError(f"{self.name}: every tensor must be on the GPU, got one on {t.device}")
        if shared_bytes > 48 * 1024:  # past 48 KB a kernel must ask for its dynamic shared memory
            func.max_dynamic_shared_size_bytes = shared_bytes
        packed = tuple(np.uint64(a.data_ptr()) if isinstance(a, torch.Tensor)
                       else np.float32(a) if isinstance(a, float) else np.int32(a) for a in args)
        func(tuple(grid), tuple(block), packed, shared_mem=shared_bytes, stream=_cupy_stream())

    def _load(self, dtype):
        """The function for dtype: compile errors surface with our line numbers (also on a GPU), and without a
        GPU the reason it cannot run."""
        name = str(dtype).removeprefix("torch.")
        if name not in CUDA_TYPES:
            raise TypeError(f"{self.name}: dtype {name} is not supported (use one of {sorted(CUDA_TYPES)})")
        self.report((name,))
        if not ON_GPU:
            raise NeedsGPU(f"{self.name} compiled; running a CuPy kernel needs a GPU (none on this machine)")
        func = self._ready[dtype] = _cupy_function(self.source, self.name, CUDA_TYPES[name])
        return func


_STREAMS: dict = {}  # torch's raw stream handle -> the CuPy stream object that wraps it


def _cupy_stream():
    """torch's current stream as a CuPy stream (made once per stream)."""
    import torch
    raw = torch.cuda.current_stream().cuda_stream
    stream = _STREAMS.get(raw)
    if stream is None:
        import warnings

        import cupy
        with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream; 13 has no replacement
            warnings.simplefilter("ignore", DeprecationWarning)
            stream = _STREAMS[raw] = cupy.cuda.ExternalStream(raw)
    return stream


@lru_cache(maxsize=64)
def _cupy_function(source: str, name: str, ctype: str):
    import cupy
    module = cupy.RawModule(code=PRELUDE + source, options=OPTIONS, name_expressions=[f"{name}<{ctype}>"])
    return module.get_function(f"{name}<{ctype}>")


# Per-SM limits of the lent GPUs (H100 / H200, compute capability 9.0).
HOPPER_SM = {"registers": 65536, "threads": 2048, "shared_bytes": 228 * 1024, "blocks": 32}


def occupancy(registers: int, shared_bytes: int, threads: int, sm: dict = HOPPER_SM):
    """Resident blocks per SM for a kernel's resources, the share of the SM's thread slots they
    fill, and which limit binds. Registers are allocated per warp in units of 256; each block also
    reserves 1 KB of shared memory for the system."""
    regs_per_warp = -(-registers * 32 // 256) * 256
    limits = {"registers": sm["registers"] // (regs_per_warp * (threads // 32)),
              "threads": sm["threads"] // threads,
              "shared memory": sm["shared_bytes"] // (shared_bytes + 1024),
              "blocks": sm["blocks"]}
    blocks = min(limits.values())
    limiter = " and ".join(name for name, value in limits.items() if value == blocks)
    return blocks, blocks * threads / sm["threads"], limiter
