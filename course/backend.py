"""Which backends this machine can run. Owns: GPU detection, the Triton interpreter switch,
the banner every notebook prints, and `python -m course doctor`.

Imported by `course/__init__.py` before anything imports Triton, because Triton reads
TRITON_INTERPRET when its kernels are defined.
"""
import ctypes
import os
import platform


def _count_cuda_devices() -> int:
    """Ask the CUDA driver directly (no torch import): 0 when there is no driver or no GPU."""
    if os.environ.get("COURSE_BACKEND") == "cpu":
        return 0
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    except OSError:
        return 0


def _interpreter_loop_bounds() -> None:
    """Triton 3.6's interpreter turns a loop bound into an int with int() of a one-element array, which NumPy 2.4
    refuses ("only 0-dimensional arrays can be converted"); later Triton takes the scalar out first. Do the same
    whatever the version, so every `tl.range(0, end)` with a computed `end` runs in the interpreter."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    original = interpreter._patch_lang_tensor
    if getattr(original, "loop_bounds_fixed", False):
        return

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
    patch.loop_bounds_fixed = True
    interpreter._patch_lang_tensor = patch


ON_GPU = _count_cuda_devices() > 0
# A cached CUDA program returns an empty ptxas log, and with it an empty resource report.
os.environ.setdefault("CUDA_CACHE_DISABLE", "1")
# A process that only compiles kernels for a GPU target (course/triton_ptx.py) stays out of the interpreter.
if not ON_GPU and os.environ.get("COURSE_COMPILE_ONLY") != "1":
    os.environ["TRITON_INTERPRET"] = "1"
    _interpreter_loop_bounds()

# Tensors for Triton and torch live here; NumPy exercises ignore it.
DEVICE = "cuda" if ON_GPU else "cpu"


def triton_dtypes() -> tuple[str, ...]:
    """dtypes a Triton kernel is graded at: bf16 arithmetic is wrong in the CPU interpreter."""
    return ("float32", "float16", "bfloat16") if ON_GPU else ("float32", "float16")


def gpu_name() -> str:
    if not ON_GPU:
        return "none"
    import torch
    return torch.cuda.get_device_name()


def banner() -> str:
    if ON_GPU:
        return f"course: GPU backend on {gpu_name()} (Triton compiled, CuPy kernels run)"
    return ("course: CPU backend (Triton interpreter on CPU tensors; CUDA C is compiled "
            "with NVRTC but not run; GPU numbers come from recorded results)")


def _version(module: str) -> str:
    try:
        mod = __import__(module)
        return getattr(mod, "__version__", "installed")
    except Exception as exc:  # noqa: BLE001 - doctor reports, never raises
        return f"missing ({exc.__class__.__name__})"


def doctor() -> int:
    """Print what this machine can run. Always exits 0: it is a report, not a test."""
    from . import cuda
    rows = [
        ("python", platform.python_version()),
        ("numpy", _version("numpy")),
        ("torch", _version("torch")),
        ("triton", _version("triton")),
        ("GPU", gpu_name()),
        ("Triton mode", "compiled for the GPU" if ON_GPU else "interpreter (TRITON_INTERPRET=1), CPU tensors"),
        ("Triton dtypes graded", ", ".join(triton_dtypes())),
        ("CuPy kernels", "run on the GPU" if ON_GPU and cuda.cupy_ok() else
         "not run here (needs a GPU); sources are still compiled with NVRTC"),
        ("NVRTC", cuda.nvrtc_status()),
        ("matplotlib", _version("matplotlib")),
    ]
    width = max(len(k) for k, _ in rows)
    print(banner())
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    return 0
