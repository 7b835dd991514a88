"""Grading: `check(exercise_id, fn)` runs every case of a task and explains the first failure.

Owns the guarantees of DESIGN.md's Grading section: fresh random inputs each run, poisoned
outputs, untouched inputs, float64 references, per-dtype tolerances with their reasons, banned
library calls, a timeout, and failure messages a learner can act on, never our traceback.
The tasks themselves (cases, references, hints) live in course/wNN_topic/tasks.py.
"""
import contextlib
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import backend, registry
from .cuda import CudaCompileError, NeedsGPU
from .stubs import MARKER, unfinished

# (atol, rtol, reason) per storage dtype. Computation is in float32 (float64 for NumPy float64).
TOLERANCES = {
    "float64": (1e-12, 1e-9, "float64 inputs: 53-bit mantissa, only summation-order differences"),
    "float32": (1e-6, 2e-5, "float32: 24-bit mantissa (unit roundoff 6e-8), fast exp on a GPU, sums of up to ~1e3 terms"),
    "float16": (1e-5, 2e-3, "float16 output: 11-bit mantissa, one rounding of the result (unit roundoff 4.9e-4)"),
    "bfloat16": (1e-5, 1.6e-2, "bfloat16 output: 8-bit mantissa, one rounding of the result (unit roundoff 3.9e-3)"),
}
TIMEOUT_S = 120
RACE = ("the output changed between two runs on the same inputs. A moving error is a race: a missing barrier, or "
        "shared memory read before every thread's copy landed (or overwritten while another warp still reads it).")
# NaNs with a payload no arithmetic produces: an element still holding one was never written.
POISON_BITS = {"float32": (0x7FC0BAD0, "int32"), "float16": (0x7E5B, "int16"), "bfloat16": (0x7FDB, "int16")}


class GradingError(AssertionError):
    """A learner-facing failure: the message says what is wrong; no grader traceback is shown."""

    def _render_traceback_(self):  # IPython prints this instead of a traceback
        return [f"\x1b[31mGradingError\x1b[0m: {self}"]


class NotImplementedYet(GradingError):
    pass


@dataclass
class Case:
    name: str
    inputs: tuple  # float64 NumPy arrays; cast to `dtype` before the call
    dtype: str
    tolerance: tuple | None = None  # (atol, rtol, reason) where the dtype's default cannot hold
    # Keyword arguments of the call and of the reference, not cast (flags, masks, integer lengths):
    # NumPy arrays among them reach a Triton/CUDA function as tensors on its device, in their own dtype.
    kwargs: dict = field(default_factory=dict)
    strided: bool = False  # pass inputs of 3+ dims as non-contiguous views (storage with axes -3, -2 swapped)
    output: str = ""       # set by the grader before a hint is asked for: the name of the output being compared


@dataclass
class Task:
    """One graded exercise. `reference(*inputs)` works on float64 arrays and returns a tuple."""
    id: str
    backend: str                      # "numpy", "triton" or "cuda"
    regions: tuple[str, ...]          # names in the exercise module that hold the learner's code
    cases: Callable                   # (rng, dtypes) -> list[Case]
    reference: Callable
    outputs: tuple[str, ...] = ("y",)
    writes_out: bool = False          # kernel launchers: fn(*inputs, out=poisoned); may return (out, more...)
    banned: tuple[str, ...] = ()
    hint: Callable | None = None      # (case, got, ref) -> str | None
    dtypes: tuple[str, ...] = ()
    # (*inputs) -> one array per output: the size of the terms each output element sums, for outputs
    # that are sums with cancellation (gradients). Their error is judged against that size, not |ref|.
    scale: Callable | None = None
    out_shape: Callable | None = None  # (*input shapes) -> shape of `out`; default: the first input's
    # fn -> None, raising GradingError: a property the cases cannot see (memory that grows as N²), checked
    # after every case passed, on a GPU only
    gpu_check: Callable | None = None

    def graded_dtypes(self) -> tuple[str, ...]:
        if self.backend == "triton":
            return tuple(d for d in self.dtypes if d in backend.triton_dtypes())
        return self.dtypes


@dataclass
class Report:
    id: str
    cases: int = 0
    max_error: dict = field(default_factory=dict)
    seconds: float = 0.0
    tolerances: dict = field(default_factory=dict)
    note: str = ""
    ran: bool = True

    def __repr__(self):
        if not self.ran:
            return f"~ {self.id}: {self.note}"
        errs = ", ".join(f"{d} {e:.0%}" for d, e in self.max_error.items())
        lines = [f"✓ {self.id}: {self.cases} cases passed in {self.seconds:.1f} s "
                 f"(largest error as a share of the tolerance: {errs})"]
        lines += [f"    tolerance {d}: atol {a:g}, rtol {r:g} — {why}" for d, (a, r, why) in self.tolerances.items()]
        if self.note:
            lines.append(f"    {self.note}")
        return "\n".join(lines)


def check(exercise_id: str, fn, seed: int | None = None, hidden: bool = False) -> Report:
    task = registry.task(exercise_id)
    seed = secrets.randbelow(2**31) if seed is None else seed
    try:
        return _run(task, fn, seed, hidden)
    except GradingError as err:
        raise type(err)(str(err)).with_traceback(None) from None


def _run(task: Task, fn, seed: int, hidden: bool) -> Report:
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    for name in task.regions:
        obj = getattr(module, name, None) if module else None
        if obj is not None and unfinished(obj):
            raise NotImplementedYet(f"{task.id} is not implemented yet: `{name}` still contains `{MARKER}`. "
                                    f"Write your code there (and delete that line), then run this cell again.")
    report = Report(task.id)
    if task.backend == "cuda":
        note = _cuda_resources(task, module)
        if not backend.ON_GPU:
            return Report(task.id, ran=False, note=f"compiled with NVRTC ({note}); not run: a CuPy kernel needs a GPU")
        report.note = note
    rng = np.random.default_rng(seed)
    cases = task.cases(rng, task.graded_dtypes())
    if hidden:
        cases += task.cases(np.random.default_rng(secrets.randbelow(2**31)), task.graded_dtypes())
    start = time.perf_counter()
    for case in cases:
        err = _run_case(task, fn, case, seed)
        report.max_error[case.dtype] = max(report.max_error.get(case.dtype, 0.0), err)
        report.tolerances[case.dtype] = TOLERANCES[case.dtype]
        if case.tolerance:
            report.tolerances[f"{case.dtype}, {case.name}"] = case.tolerance
    if task.gpu_check and backend.ON_GPU:
        with _timeout(TIMEOUT_S):
            task.gpu_check(fn)
    report.cases, report.seconds = len(cases), time.perf_counter() - start
    return report


def _cuda_resources(task: Task, module) -> str:
    sources = [getattr(module, r) for r in task.regions if isinstance(getattr(module, r, None), str)]
    try:
        from .cuda import compile_report
        kernel = task.id.split(".")[1]
        reports = [r for src in sources for r in compile_report(src, kernel, tuple(task.dtypes))]
    except CudaCompileError as err:
        raise GradingError(f"{task.id}: your CUDA C does not compile.\n{err}") from None
    return "; ".join(str(r) for r in reports)


def exact(reference):
    """A reference that returns plain numbers (counts, bounds) as the float64 arrays the grader compares."""
    return lambda **kw: tuple(np.asarray(x, dtype=np.float64) for x in reference(**kw))


def closest_bug(got: np.ndarray, candidates: dict, rtol: float = 2e-2) -> str | None:
    """Diagnosis: the hint of the known wrong answer that `got` matches. `candidates` maps a hint to what a known
    bug makes of this output on the case's inputs (an array, or a list of arrays where the bug has several
    forms); `got` matches one when it is within rtol of it (relative to that answer's largest entry) at every
    finite element and non-finite where it is. The closest match wins; on a tie, the first."""
    best, best_err = None, rtol
    for hint, outputs in candidates.items():
        for wrong in outputs if isinstance(outputs, list) else [outputs]:
            wrong = np.asarray(wrong, dtype=np.float64)
            if wrong.shape != got.shape:
                continue
            both = np.isfinite(wrong) & np.isfinite(got)
            if not (np.isfinite(wrong) == np.isfinite(got)).all() or not both.any():
                continue
            err = np.abs(got[both] - wrong[both]).max() / max(np.abs(wrong[both]).max(), 1e-30)
            if err < best_err:
                best, best_err = hint, err
    return best


def _to_backend(task: Task, array: np.ndarray, dtype: str, strided: bool = False):
    """`array` cast to `dtype` for the task's backend; with `strided`, as a view whose storage has
    axes -3 and -2 swapped (a (B, N, H, d) buffer seen as (B, H, N, d)), so it is not contiguous."""
    swap = strided and array.ndim >= 3
    if swap:
        array = np.swapaxes(array, -3, -2)
    if task.backend == "numpy":
        cast = np.ascontiguousarray(array.astype(dtype))
        return np.swapaxes(cast, -3, -2) if swap else cast
    import torch
    cast = torch.from_numpy(np.ascontiguousarray(array)).to(device=backend.DEVICE, dtype=getattr(torch, dtype))
    return cast.transpose(-3, -2) if swap else cast


def _kwargs_to_backend(task: Task, kwargs: dict) -> dict:
    if task.backend == "numpy":
        return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in kwargs.items()}
    import torch
    return {k: torch.from_numpy(v.copy()).to(backend.DEVICE) if isinstance(v, np.ndarray) else v
            for k, v in kwargs.items()}


def _to_float64(value) -> np.ndarray:
    if hasattr(value, "detach"):
        return value.detach().float().cpu().numpy().astype(np.float64)
    return np.asarray(value, dtype=np.float64)


def _poisoned_like(x, shape):
    import torch
    bits, int_type = POISON_BITS[str(x.dtype).removeprefix("torch.")]
    return torch.full(tuple(shape), bits, dtype=getattr(torch, int_type), device=x.device).view(x.dtype)


@contextlib.contextmanager
def _poisoned_allocations(task: Task):
    """While the learner's launcher runs, torch.empty and torch.empty_like hand out tensors filled with the poison:
    an output it allocates and never writes (a mean, an LSE, a whole result) is then caught like `out`."""
    if task.backend == "numpy":
        yield
        return
    import torch
    empty, empty_like = torch.empty, torch.empty_like

    def poisoned(make):
        def allocate(*args, **kwargs):
            t = make(*args, **kwargs)
            name = str(t.dtype).removeprefix("torch.")
            if name in POISON_BITS and t.numel():
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


def _run_case(task: Task, fn, case: Case, seed: int) -> float:
    where = f'{task.id} failed on case "{case.name}" ({case.dtype})'
    again = f'reproduce with: course.check("{task.id}", {getattr(fn, "__name__", "fn")}, seed={seed})'
    inputs = tuple(_to_backend(task, a, case.dtype, case.strided) for a in case.inputs)
    kwargs = _kwargs_to_backend(task, case.kwargs)
    ref = task.reference(*(_to_float64(a) for a in inputs), **case.kwargs)
    scales = task.scale(*(_to_float64(a) for a in inputs), **case.kwargs) if task.scale else (None,) * len(ref)
    before = [_to_float64(a).copy() for a in inputs]
    out = None
    if task.writes_out:
        shape = task.out_shape(*(a.shape for a in inputs)) if task.out_shape else inputs[0].shape
        out = _poisoned_like(inputs[0], shape)
    try:
        with _banned(task.banned), _timeout(TIMEOUT_S), np.errstate(all="ignore"), _poisoned_allocations(task):
            got = fn(*inputs, out=out, **kwargs) if task.writes_out else fn(*inputs, **kwargs)
            if task.backend != "numpy" and backend.ON_GPU:
                import torch
                torch.cuda.synchronize()
    except GradingError:
        raise
    except NotImplementedError:
        raise NotImplementedYet(f"{task.id} is not implemented yet (it raised NotImplementedError).") from None
    except NeedsGPU as exc:
        raise GradingError(f"{where}: {exc}") from None
    except Exception as exc:  # the learner's code raised: show their error, not ours
        raise GradingError(f"{where}: your code raised {type(exc).__name__}: {exc}\n  {again}") from None
    except SystemExit as exc:
        raise GradingError(f"{where}: your code called exit ({exc.code}); return the result instead.") from None
    except KeyboardInterrupt:
        raise GradingError(f"{where}: interrupted while your code ran (a kernel that never finishes?). Try the "
                           f"case on its own with small sizes.\n  {again}") from None
    for i, (a, b) in enumerate(zip(before, inputs)):
        if not np.array_equal(a, _to_float64(b), equal_nan=True):
            raise GradingError(f"{where}: input {i} was modified. Write results to a new array or `out`.")
    if task.writes_out:
        import torch
        _, int_type = POISON_BITS[case.dtype]
        unwritten = (out.view(getattr(torch, int_type)) == POISON_BITS[case.dtype][0]).cpu().numpy()
        more = got[1:] if isinstance(got, tuple) else ()
        if isinstance(got, tuple) and not (isinstance(got[0], torch.Tensor) and got[0].data_ptr() == out.data_ptr()):
            raise GradingError(f"{where}: the first output must be the `out` tensor you were given (write into it).")
        got = (out, *more)
    else:
        several = isinstance(got, (tuple, list)) and len(ref) > 1 and len(got) == len(ref)
        got = tuple(got) if several or isinstance(got, tuple) else (got,)
        unwritten = None
    if len(got) != len(ref):
        raise GradingError(f"{where}: expected {len(ref)} outputs ({', '.join(task.outputs)}), got {len(got)}.")
    worst = 0.0
    unwritten = [unwritten if i == 0 and unwritten is not None else _never_written(g) for i, g in enumerate(got)]
    try:
        got = [_to_float64(g) for g in got]
    except (TypeError, ValueError) as exc:
        kinds = ", ".join(type(g).__name__ for g in got)
        raise GradingError(f"{where}: the outputs must be numbers (NumPy arrays, tensors or numbers: "
                           f"{', '.join(task.outputs)}); got {kinds} ({exc}).") from None
    for i, (name, g, r, size) in enumerate(zip(task.outputs, got, ref, scales)):
        if g.shape != r.shape:
            raise GradingError(f"{where}: output `{name}` has shape {g.shape}, expected {r.shape}.")
        unwritten_here = unwritten[i]
        try:
            with np.errstate(all="ignore"):
                worst = max(worst, _compare(task, case, name, g, r, unwritten_here, where, again, size))
        except GradingError as err:
            if _moves(task, fn, inputs, kwargs, got):
                raise GradingError(f"{err}\n  and: {RACE}") from None
            raise
    return worst


def _moves(task: Task, fn, inputs, kwargs, first) -> bool:
    """On a GPU, after a failure: does a second run on the same inputs give other outputs? (A race's signature;
    the CPU interpreter runs programs one after another and cannot show one.)"""
    if task.backend == "numpy" or not backend.ON_GPU:
        return False
    try:
        with _banned(task.banned), _timeout(TIMEOUT_S), np.errstate(all="ignore"):
            if task.writes_out:
                again = fn(*inputs, out=_poisoned_like(inputs[0], first[0].shape), **kwargs)
            else:
                again = fn(*inputs, **kwargs)
    except Exception:  # noqa: BLE001 - the first run's failure is the one to report
        return False
    again = again if isinstance(again, tuple) else (again,)
    return any(not np.array_equal(a, _to_float64(b), equal_nan=True) for a, b in zip(first, again))


def _compare(task, case, name, got, ref, unwritten, where, again, size=None) -> float:
    atol, rtol, why = case.tolerance or TOLERANCES[case.dtype]
    finite = np.isfinite(ref)
    err = np.where(finite, np.abs(got - ref), np.where(got == ref, 0.0, np.inf))
    err = np.nan_to_num(err, nan=np.inf)
    magnitude = np.abs(np.where(finite, ref, 0.0))
    if size is not None:  # a sum with cancellation: judged against the size of its terms
        magnitude = np.maximum(magnitude, size)
        why += "; relative to the size of the summed terms"
    allowed = atol + rtol * magnitude
    bad = err > allowed
    if not bad.any():
        return float(np.max(err / allowed, initial=0.0))
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    lines = [f"{where}: output `{name}` is wrong at {int(bad.sum())} of {bad.size} elements.",
             f"  first wrong element {list(first)} of shape {list(ref.shape)}: got {_pair(got[first], ref[first])}"]
    hint = None
    if unwritten is not None and unwritten.any():
        idx = [int(i) for i in np.argwhere(unwritten)[0]]
        hint = (f"{int(unwritten.sum())} elements were never written (first at {idx}): does the grid "
                f"cover every row, and does the mask reach the last, partial block?")
    case.output = name
    hint = hint or (task.hint(case, got, ref) if task.hint else None) or _location_hint(bad)
    if hint:
        lines.append(f"  hint: {hint}")
    lines.append(f"  tolerance: |got - expected| <= {atol:g} + {rtol:g}·|expected| ({why})")
    lines.append(f"  {again}")
    raise GradingError("\n".join(lines))


def _number(x: float, digits: int) -> str:
    return str(int(x)) if np.isfinite(x) and float(x).is_integer() and abs(x) < 2 ** 53 else f"{x:.{digits}g}"


def _pair(got: float, expected: float) -> str:
    """"got A, expected B" with the fewest digits (at least 6) that show the two differ; integers exactly."""
    for digits in range(6, 18):
        a, b = _number(got, digits), _number(expected, digits)
        if a != b:
            break
    return f"{a}, expected {b}"


def _location_hint(bad: np.ndarray) -> str | None:
    if bad.ndim != 2:
        return None
    rows, cols = bad.any(axis=1), bad.any(axis=0)
    if rows.all() and not cols.all():
        return f"only columns from {int(np.argmax(cols))} on are wrong: is the last, partial block masked?"
    if cols.all() and not rows.all() and rows[-1]:
        return f"only rows from {int(np.argmax(rows))} on are wrong: does the grid cover every row?"
    return None


@contextlib.contextmanager
def _timeout(seconds: int):
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
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
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
