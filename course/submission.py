"""Running a learner's submission: everything that happens while their code runs, and nothing else.

Owns: inputs placed on the device in the case's dtype, outputs poisoned and fenced by guard bands, library calls
the exercise bans refused (by name and at PyTorch's dispatcher), the course's references refused, the interpreter's
memory checks (course/memcheck.py), the timeout, and the learner-facing message for anything their code raises.
It returns raw outcomes (float64 arrays and where they were never written); comparing them with a reference is
course/grading.py's job. The official grade runs this module alone in a child process (course/isolated.py): it
imports no task and no reference, so nothing here can leak an expected answer.
"""
import contextlib
import re
import signal
import sys
import threading
import types
from dataclasses import dataclass, field

import numpy as np

from . import backend
from .cuda import NeedsGPU

TIMEOUT_S = 120
# NaNs with a payload no arithmetic produces: an element still holding one was never written.
POISON_BITS = {"float32": (0x7FC0BAD0, "int32"), "float16": (0x7E5B, "int16"), "bfloat16": (0x7FDB, "int16")}
# Poisoned memory before and after every output the grader allocates (a multiple of 512 bytes keeps the output's
# alignment): a store past the end lands here, is counted, and corrupts nothing.
BAND_BYTES = 256 * 1024
# Modules exercise code may not use: the course's references, cost model, tasks and solutions, and the grader.
FORBIDDEN = re.compile(r"^(course\.(w\d\d_\w+|attention_cost|grading|registry|mutants|isolated)|solutions|tests)"
                       r"(\.|$)")
# Refused while a submission runs: every module of a week's package (references, tasks, cost models, benchmarks), the
# shared cost model, and the solutions (those of the weeks a task builds on excepted: Task.builds_on).
_REFERENCES = re.compile(r"^(course\.(w\d\d_\w+\.\w+|attention_cost)|solutions\.\w+)$")
REFUSED = "course-refused:"


class GradingError(AssertionError):
    """A learner-facing failure: the message says what is wrong; no grader traceback is shown."""

    def _render_traceback_(self):  # IPython prints this instead of a traceback
        return [f"\x1b[31mGradingError\x1b[0m: {self}"]


class NotImplementedYet(GradingError):
    pass


@dataclass
class Spec:
    """What running an exercise needs to know about its task (no reference, no expected answer)."""
    exercise: str
    backend: str                     # "numpy", "triton" or "cuda"
    regions: tuple = ()              # names in the exercise module that hold the learner's code
    dtypes: tuple = ()
    banned: tuple = ()
    writes_out: bool = False
    entry: str = ""                  # the exercise module's function the learner writes (Task.entry)
    week: str = ""                   # "w33" (Task.week)
    builds_on: tuple = ()            # earlier weeks ("w34_layernorm") whose kernels the exercise calls (Task.builds_on)


@dataclass
class CaseCall:
    """One case as the submission side sees it."""
    inputs: tuple                    # float64 arrays holding values exact in `dtype`
    dtype: str
    strided: bool = False
    kwargs: dict = field(default_factory=dict)
    out_shape: tuple | None = None   # shape of the `out` the grader passes, for launchers
    where: str = ""                  # 'w33.x failed on case "..." (float32)'
    again: str = ""                  # how to reproduce the case


@dataclass
class Outcome:
    outputs: list                    # float64 arrays, one per output
    unwritten: list                  # per output: bool array of elements still poisoned, or None
    stray: str = ""                  # what was written outside the outputs (guard bands), if anything
    launches: list = field(default_factory=list)  # Triton launches seen by the interpreter (memcheck.Launch)


def to_backend(kind: str, array: np.ndarray, dtype: str, strided: bool = False, device: str | None = None):
    """`array` cast to `dtype` for backend `kind`; with `strided`, as a view whose storage has axes -3 and -2 swapped
    (a (B, N, H, d) buffer seen as (B, H, N, d)), so it is not contiguous."""
    swap = strided and array.ndim >= 3
    if swap:
        array = np.swapaxes(array, -3, -2)
    if kind == "numpy":
        cast = np.ascontiguousarray(array.astype(dtype))
        return np.swapaxes(cast, -3, -2) if swap else cast
    import torch
    cast = torch.from_numpy(np.ascontiguousarray(array)).to(device=device or backend.DEVICE,
                                                            dtype=getattr(torch, dtype))
    return cast.transpose(-3, -2) if swap else cast


def kwargs_to_backend(kind: str, kwargs: dict) -> dict:
    if kind == "numpy":
        return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in kwargs.items()}
    import torch
    return {k: torch.from_numpy(v.copy()).to(backend.DEVICE) if isinstance(v, np.ndarray) else v
            for k, v in kwargs.items()}


def to_float64(value) -> np.ndarray:
    if hasattr(value, "detach"):
        return value.detach().float().cpu().numpy().astype(np.float64)
    return np.asarray(value, dtype=np.float64)


def _banded(shape, dtype, device):
    """(storage, view): a poisoned tensor of `shape` inside a storage with BAND_BYTES of poison on each side."""
    import torch
    bits, int_type = POISON_BITS[str(dtype).removeprefix("torch.")]
    n = int(np.prod(shape, dtype=np.int64))
    band = BAND_BYTES // dtype.itemsize
    storage = torch.full((n + 2 * band,), bits, dtype=getattr(torch, int_type), device=device).view(dtype)
    return storage, storage[band:band + n].view(tuple(shape))


def _band_writes(storage, view) -> tuple[int, int]:
    """Elements written before the start and past the end of `view` inside its banded storage."""
    import torch
    bits, int_type = POISON_BITS[str(storage.dtype).removeprefix("torch.")]
    raw = storage.view(getattr(torch, int_type))
    start, n = view.storage_offset(), view.numel()
    return int((raw[:start] != bits).sum()), int((raw[start + n:] != bits).sum())


@contextlib.contextmanager
def _poisoned_allocations(kind: str, allocated: list):
    """While the learner's launcher runs, torch.empty and torch.empty_like hand out poisoned tensors inside guard
    bands: an output it allocates and never writes (a mean, an LSE, a whole result) is caught like `out`, and a
    store past its end is counted. Each (storage, view) handed out is appended to `allocated`."""
    if kind == "numpy":
        yield
        return
    import torch
    empty, empty_like = torch.empty, torch.empty_like

    def poisoned(make):
        def allocate(*args, **kwargs):
            t = make(*args, **kwargs)
            name = str(t.dtype).removeprefix("torch.")
            if name not in POISON_BITS or not t.numel():
                return t
            if t.is_contiguous() and not t.requires_grad and "out" not in kwargs:
                storage, view = _banded(t.shape, t.dtype, t.device)
                allocated.append((storage, view))
                return view
            bits, int_type = POISON_BITS[name]
            t.view(getattr(torch, int_type)).fill_(bits)
            return t
        return allocate
    torch.empty, torch.empty_like = poisoned(empty), poisoned(empty_like)
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like


def _never_written(value):
    """Where a returned tensor still holds the poison (None for anything else)."""
    name = str(getattr(value, "dtype", "")).removeprefix("torch.")
    if not hasattr(value, "detach") or name not in POISON_BITS:
        return None
    import torch
    bits, int_type = POISON_BITS[name]
    return (value.detach().view(getattr(torch, int_type)) == bits).cpu().numpy()


def begin(spec: Spec, fn) -> tuple[bool, str]:
    """Before any case: (whether the cases can run here, a note). Raises NotImplementedYet while a region still
    holds the stub marker, and a GradingError for exercise code that imports the course's answers or CUDA C that
    does not compile."""
    from .stubs import MARKER, unfinished
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    for name in spec.regions:
        obj = getattr(module, name, None) if module else None
        if obj is not None and unfinished(obj):
            raise NotImplementedYet(f"{spec.exercise} is not implemented yet: `{name}` still contains `{MARKER}`. "
                                    f"Write your code there (and delete that line), then run this cell again.")
    found = forbidden_imports(spec, fn)
    if found:
        raise GradingError(f"{spec.exercise}: your exercise code imports {', '.join(f'`{m}`' for m in found)}, part "
                           f"of the course's own answers (references, tasks, solutions, the grader). The exercise "
                           f"asks you to compute it yourself: remove that import.")
    if spec.backend != "cuda":
        return True, ""
    from .cuda import CudaCompileError, compile_report
    sources = [getattr(module, r) for r in spec.regions if isinstance(getattr(module, r, None), str)]
    try:
        kernel = spec.entry
        note = "; ".join(str(r) for src in sources for r in compile_report(src, kernel, tuple(spec.dtypes)))
    except CudaCompileError as err:
        raise GradingError(f"{spec.exercise}: your CUDA C does not compile.\n{err}") from None
    if not backend.ON_GPU:
        return False, f"compiled with NVRTC ({note}); not run: a CuPy kernel needs a GPU"
    return True, note


def run(spec: Spec, fn, call: CaseCall) -> Outcome:
    """Run `fn` on the case's inputs; raise a GradingError (the learner's own error, in words) or return the raw
    outcome."""
    from . import memcheck
    where, again = call.where, call.again
    args = tuple(to_backend(spec.backend, a, call.dtype, call.strided) for a in call.inputs)
    kw = kwargs_to_backend(spec.backend, call.kwargs)
    before = [to_float64(a).copy() for a in args]
    out = storage = None
    if spec.writes_out:
        storage, out = _banded(call.out_shape or args[0].shape, args[0].dtype, args[0].device)
    allocated = []
    try:
        with _banned(spec.banned), references_refused(fn, spec.builds_on), timeout(TIMEOUT_S), \
                np.errstate(all="ignore"), _poisoned_allocations(spec.backend, allocated), \
                memcheck.watching() as launches:
            got = fn(*args, out=out, **kw) if spec.writes_out else fn(*args, **kw)
            if spec.backend != "numpy" and backend.ON_GPU:
                import torch
                torch.cuda.synchronize()
    except GradingError as exc:
        raise GradingError(f"{where}: {exc}") from None
    except NotImplementedError:
        raise NotImplementedYet(f"{spec.exercise} is not implemented yet (it raised NotImplementedError).") from None
    except NeedsGPU as exc:
        raise GradingError(f"{where}: {exc}") from None
    except Exception as exc:  # the learner's code raised: show their error, not ours
        raise GradingError(f"{where}: {_learner_error(exc)}\n  {again}") from None
    except SystemExit as exc:
        raise GradingError(f"{where}: your code called exit ({exc.code}); return the result instead.") from None
    except KeyboardInterrupt:
        raise GradingError(f"{where}: interrupted while your code ran (a kernel that never finishes?). Try the "
                           f"case on its own with small sizes.\n  {again}") from None
    for i, (a, b) in enumerate(zip(before, args)):
        if not np.array_equal(a, to_float64(b), equal_nan=True):
            raise GradingError(f"{where}: input {i} was modified. Write results to a new array or `out`.")
    stray = _stray_writes(storage, out, allocated)
    if spec.writes_out:
        import torch
        if isinstance(got, (tuple, list)) and not (isinstance(got[0], torch.Tensor) and got[0].data_ptr() ==
                                                   out.data_ptr()):
            raise GradingError(f"{where}: the first output must be the `out` tensor you were given (write into it).")
        got = (out, *(got[1:] if isinstance(got, (tuple, list)) else ()))
    else:
        got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
    unwritten = [_never_written(g) for g in got]
    try:
        outputs = [to_float64(g) for g in got]
    except (TypeError, ValueError) as exc:
        kinds = ", ".join(type(g).__name__ for g in got)
        raise GradingError(f"{where}: the outputs must be numbers (NumPy arrays, tensors or numbers); got {kinds} "
                           f"({exc}).") from None
    return Outcome(outputs, unwritten, stray, launches)


def _learner_error(exc: BaseException) -> str:
    """What the learner's code raised, in their words: our own refusals (memory, references) are unwrapped from the
    interpreter's InterpreterError."""
    from . import memcheck
    for inner in (exc, exc.__cause__, exc.__context__):
        if isinstance(inner, memcheck.OutOfBounds):
            return str(inner)
        if isinstance(inner, PermissionError) and str(inner).startswith(REFUSED):
            name = str(inner)[len(REFUSED):].strip()
            return (f"your code called `{name}`, which belongs to the course's own answers (a reference, a task or "
                    f"a solution). The exercise asks you to compute it yourself.")
    if "PassManager::run failed" in str(exc):  # Triton's own compiler broke: its log above names the pass
        return (f"Triton's compiler failed inside one of its own passes while compiling your kernel ({exc}; the "
                f"log printed above names the pass). That is an internal error of Triton {_triton_version()}, not a "
                f"wrong result: the same computation written another way (a reduction moved out of a loop, a "
                f"different block size) usually compiles.")
    return f"your code raised {type(exc).__name__}: {exc}"


def _triton_version() -> str:
    import triton
    return triton.__version__


def _stray_writes(storage, out, allocated) -> str:
    """Words for what was written into the guard bands, or ""."""
    fences = ([(storage, out, "`out`")] if storage is not None else []) + \
        [(s, v, f"a tensor your launcher allocated (shape {tuple(v.shape)})") for s, v in allocated]
    for s, v, name in fences:
        before, after = _band_writes(s, v)
        if after:
            return f"wrote {after} elements past the end of {name}: mask the store."
        if before:
            return f"wrote {before} elements before the start of {name}: is an offset negative?"
    return ""


# ---- references refused -------------------------------------------------------------------------------------------

def forbidden_imports(spec: Spec, fn) -> list[str]:
    """The course's answers the learner's exercise file has imported (names bound in its globals), or that `fn`
    itself is. The exercise file is the module `course.exercises.wNN_*` that holds `fn` (or defines it). Code
    defined elsewhere (a notebook cell, a test) is covered while it runs by references_refused."""
    own = getattr(fn, "__module__", "") or ""
    if _REFERENCES.match(own) and not own.startswith("solutions."):
        return [own]
    week = spec.week + "_"
    files = [m for name, m in list(sys.modules.items()) if name.startswith("course.exercises." + week)
             and m is not None and (getattr(m, spec.entry, None) is fn or name == own)]
    found = set()
    for module in files:
        for value in vars(module).values():
            name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
            if isinstance(name, str) and name != module.__name__ and FORBIDDEN.match(name):
                found.add(name)
    return sorted(found)


def _refuser(name: str) -> types.CodeType:
    source = f"def refused(*args, **kwargs):\n    raise PermissionError({REFUSED + ' ' + name!r})\n"
    namespace = {}
    exec(compile(source, "<refused>", "exec"), namespace)  # noqa: S102 - our own constant text
    return namespace["refused"].__code__


@contextlib.contextmanager
def references_refused(fn, builds_on: tuple = ()):
    """While `fn` runs, every function of the course's references, tasks, cost model and solutions (other than
    `fn`'s own module and the solutions of the weeks in `builds_on`, whose kernels an exercise that assembles them
    calls through course.kernels) raises: an alias bound at import time is the same function object, so it is caught
    too."""
    own = getattr(fn, "__module__", "") or ""
    allowed = {own} | {f"solutions.{week}" for week in builds_on}
    swapped = []
    for name, module in list(sys.modules.items()):
        if name in allowed or module is None or not _REFERENCES.match(name):
            continue
        for value in list(vars(module).values()):
            targets = [value] if isinstance(value, types.FunctionType) else \
                [v for v in vars(value).values() if isinstance(v, types.FunctionType)] if isinstance(value, type) \
                else []
            for f in targets:
                if f.__module__ == name and not f.__code__.co_freevars:
                    swapped.append((f, f.__code__))
                    f.__code__ = _refuser(f"{name}.{f.__qualname__}")
    try:
        yield
    finally:
        for f, code in swapped:
            f.__code__ = code


def run_gpu_check(exercise: str, gpu_check, fn) -> None:
    """A task's check at scale (after every case passed, on a GPU). The check's own code may use the course's; the
    submission it calls runs with the course's answers refused, and whatever it raises is reported in words."""
    def guarded(*args, **kwargs):
        with references_refused(fn):
            return fn(*args, **kwargs)
    try:
        with timeout(TIMEOUT_S):
            gpu_check(guarded)
    except GradingError as exc:
        raise GradingError(f"{exercise}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the learner's code raised inside the check
        raise GradingError(f"{exercise}, run at scale on the GPU: {_learner_error(exc)}") from None


# ---- the timeout --------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def timeout(seconds: int):
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(*_):
        raise GradingError(f"your code ran for more than {seconds} s: an endless loop, or a kernel that "
                           f"waits for something that never happens?")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---- banned library calls -----------------------------------------------------------------------------------------

# aten operators (the names the dispatcher sees, after PyTorch's Python layer and any alias) of each family an
# exercise may ban; a banned Python name of the family bans them all.
ATEN_FAMILIES = {
    "softmax": ("softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax", "special_softmax"),
    "layer_norm": ("layer_norm", "native_layer_norm"),
    "rms_norm": ("rms_norm", "_fused_rms_norm"),
    "scaled_dot_product": ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                           "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                           "_scaled_dot_product_flash_attention_for_cpu", "_flash_attention_forward",
                           "_efficient_attention_forward", "_scaled_dot_product_attention_math"),
    "matmul": ("mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "_addmm_activation", "einsum"),
    "gelu": ("gelu", "gelu_backward"),
    "silu": ("silu", "silu_backward"),
    "tanh": ("tanh", "tanh_backward"),
    "dropout": ("dropout", "native_dropout", "native_dropout_backward", "feature_dropout", "alpha_dropout"),
}
_MATMUL_NAMES = ("matmul", "bmm", "einsum", "__matmul__", "baddbmm", "mm")


def _aten_banned(names: tuple[str, ...]) -> dict:
    """aten operator -> its family, for the families the banned Python names belong to."""
    ops = {}
    for dotted in names:
        leaf = dotted.rsplit(".", 1)[-1]
        for family, members in ATEN_FAMILIES.items():
            if family in leaf or (family == "matmul" and leaf in _MATMUL_NAMES) or \
                    (family == "scaled_dot_product" and "multi_head_attention" in leaf):
                ops.update({op: family.replace("_", " ") for op in members})
    return ops


@contextlib.contextmanager
def _dispatch_guard(names: tuple[str, ...]):
    """Refuse the banned families where PyTorch runs them, at the dispatcher: an alias bound at import time, a
    private or `torch.ops.aten` entry point or a method all arrive there as the same aten operator."""
    ops = _aten_banned(names)
    if not ops or "torch" not in sys.modules:
        yield
        return
    from torch.utils._python_dispatch import TorchDispatchMode

    class Guard(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in ops:
                raise GradingError(f"this exercise asks you to write it yourself: your code ran PyTorch's "
                                   f"`aten.{name}`, a {ops[name]} operator (whatever name it was called by).")
            return func(*args, **(kwargs or {}))
    with Guard():
        yield


@contextlib.contextmanager
def _banned(names: tuple[str, ...]):
    """Replace library functions the exercise asks the learner to write with ones that fail, and refuse their
    operators at PyTorch's dispatcher (_dispatch_guard)."""
    with _dispatch_guard(names), _named(names):
        yield


@contextlib.contextmanager
def _named(names: tuple[str, ...]):
    saved = []
    for dotted in names:
        module_name, attr = dotted.rsplit(".", 1)
        try:
            owner = _resolve(module_name)
        except (ImportError, AttributeError):
            continue
        saved.append((owner, attr, getattr(owner, attr)))

        def refuse(*_, _name=dotted, **__):
            raise GradingError(f"this exercise asks you to write it yourself: calling `{_name}` is not allowed here.")
        setattr(owner, attr, refuse)
    try:
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


def _resolve(dotted: str):
    import importlib
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[:i + 1]))
    return obj
