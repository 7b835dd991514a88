"""Grading: `check(exercise_id, fn)` runs every case of a task and explains what is wrong.

Owns the grading guarantees (README, CONTRIBUTING.md) on the judging side: fresh random inputs each run, float64
references on the inputs as rounded to the case's dtype, per-dtype tolerances with their reasons, and failure
messages a learner can act on, never our traceback; after a failure, a hint chosen by diagnosing every failing case
of that dtype together (which known bug do they match?). Running the learner's code (poison, guard bands, banned
calls, references refused, the timeout) is course/submission.py's; `check` does both in this process, the official
grade (course/isolated.py) runs the submission in a child that never sees a reference.
The tasks themselves (cases, references, hints) live in course/wNN_topic/tasks.py.
"""
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import backend, registry, submission
from .submission import POISON_BITS, TIMEOUT_S, GradingError, NotImplementedYet, to_backend, to_float64  # noqa: F401

# (atol, rtol, reason) per storage dtype. Computation is in float32 (float64 for NumPy float64).
TOLERANCES = {
    "float64": (1e-12, 1e-9, "float64 inputs: 53-bit mantissa, only summation-order differences"),
    "float32": (1e-6, 2e-5, "float32: 24-bit mantissa (unit roundoff 6e-8), sums of up to ~1e3 terms, a GPU kernel's fast exp"),
    "float16": (1e-5, 2e-3, "float16 output: 11-bit mantissa, one rounding of the result (unit roundoff 4.9e-4)"),
    "bfloat16": (1e-5, 1.6e-2, "bfloat16 output: 8-bit mantissa, one rounding of the result (unit roundoff 3.9e-3)"),
}
RACE = ("the output changed between two runs on the same inputs. A moving error is a race: a missing barrier, or "
        "shared memory read before every thread's copy landed (or overwritten while another warp still reads it).")
OR = "\n    or: "  # between the hints of bugs a case cannot tell apart
OFFICIAL = "This check ran in your notebook's process; the official grade is `make grade` (`python -m course grade`)."


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
    """One graded exercise. `reference(*inputs)` works on float64 arrays and returns a tuple.
    `id` is "<week>.<entry>" ("w33.online_softmax"); `entry` is the function of the exercise module the learner
    writes (the id's second part unless given), `week` the id's first part: no other module splits an id."""
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
    entry: str = ""
    # earlier weeks ("w34_layernorm") whose kernels the exercise assembles through course.kernels: their solutions
    # stay callable while the submission runs (every other week's are refused)
    builds_on: tuple[str, ...] = ()

    def __post_init__(self):
        self.entry = self.entry or self.id.split(".")[1]

    @property
    def week(self) -> str:
        return self.id.split(".")[0]

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


def exact(reference):
    """A reference that returns plain numbers (counts, bounds) as the float64 arrays the grader compares."""
    return lambda **kw: tuple(np.asarray(x, dtype=np.float64) for x in reference(**kw))


def seen(case: "Case") -> tuple:
    """The case's inputs as the learner's code saw them: rounded to the case's dtype, back in float64."""
    return tuple(to_float64(to_backend("torch", a, case.dtype, device="cpu")) for a in case.inputs)


def _distance(got: np.ndarray, forms) -> float:
    """How far `got` is from a known wrong answer (the nearest of its forms), relative to that answer's largest
    entry, over the finite elements; inf where the non-finite elements differ. An answer with nothing finite is 0
    away only from the same answer, element for element."""
    best = np.inf
    for wrong in forms if isinstance(forms, list) else [forms]:
        if wrong is None:
            continue
        wrong = np.asarray(wrong, dtype=np.float64)
        if wrong.shape != got.shape or (np.isfinite(wrong) != np.isfinite(got)).any():
            continue
        both = np.isfinite(wrong)
        if not both.any():
            best = 0.0 if np.array_equal(wrong, got, equal_nan=True) else best
            continue
        best = min(best, float(np.abs(got[both] - wrong[both]).max() / max(np.abs(wrong[both]).max(), 1e-30)))
    return best


def matching_bugs(got: np.ndarray, expected: np.ndarray, candidates: dict, rtol: float = 2e-2) -> list[str]:
    """Diagnosis: the hints of the known bugs whose output `got` matches best. `candidates` maps a hint to what
    that bug makes of this output on the case's own inputs (an array, or a list of the forms it can take). A match
    is within rtol of the form's largest entry and strictly nearer to it than to the right answer (so a bug that is
    a no-op on this case, or an answer that is merely imprecise, names nothing). Several hints where bugs give the
    same output here (the case cannot tell them apart); none where nothing matches."""
    right = _distance(got, np.asarray(expected, dtype=np.float64))
    distances = {hint: _distance(got, forms) for hint, forms in candidates.items()}
    best = min(distances.values(), default=np.inf)
    if not (best < rtol and best < right):
        return []
    return [hint for hint, d in distances.items() if d <= best * (1 + 1e-6) + 1e-12]


def pick(variants: dict, index: int) -> dict:
    """{hint: forms of output `index`} from {hint: [(out0, out1, ...), ...]}: the candidates for one output of an
    exercise with several (diagnose compares one output at a time)."""
    return {h: [form[index] for form in forms] for h, forms in variants.items()}


def diagnose(got: np.ndarray, expected: np.ndarray, candidates: dict, rtol: float = 2e-2) -> str | None:
    """The known bug `got` matches on this case (matching_bugs), or None. Where the case cannot tell several apart,
    all of them joined by OR: the grader weighs them against the other failing cases (_diagnosis)."""
    found = matching_bugs(got, expected, candidates, rtol)
    return OR.join(found[:3]) or None


def closest_bug(got: np.ndarray, candidates: dict, rtol: float = 2e-2) -> str | None:
    """The hint of the known wrong answer `got` is nearest to (within rtol), whatever the right answer is; on a tie,
    the first. `diagnose` is the usual entry point; this is for candidates that are never right."""
    distances = {hint: _distance(got, forms) for hint, forms in candidates.items()}
    best = min(distances, key=distances.get, default=None)
    return best if best is not None and distances[best] < rtol else None


def spec_of(task: "Task") -> submission.Spec:
    return submission.Spec(task.id, task.backend, task.regions, task.graded_dtypes(), task.banned, task.writes_out,
                           task.entry, task.week, task.builds_on)


class LocalRunner:
    """Runs the submission in this process (the notebook's `check`). course/isolated.py has the same three methods
    and runs them in a child process."""

    def __init__(self, task: "Task", fn):
        self.spec, self.fn = spec_of(task), fn
        self.gpu_check = task.gpu_check
        self.interpreted = not backend.ON_GPU
        self.source, self.name = _file_of(fn)

    def begin(self) -> tuple[bool, str]:
        return submission.begin(self.spec, self.fn)

    def run(self, trial: "Trial") -> submission.Outcome:
        return submission.run(self.spec, self.fn, trial.call)

    def finish(self, launches: list) -> str:
        from . import triton_ptx
        if self.gpu_check and backend.ON_GPU:
            submission.run_gpu_check(self.spec.exercise, self.gpu_check, self.fn)
        return triton_ptx.gpu_compile_errors(launches)


def _file_of(fn) -> tuple:
    """(path, name) of the module-level function `fn` in a file a child process can load, else (None, None):
    a function defined in a notebook cell has none."""
    import inspect
    import sys
    from pathlib import Path
    module, name = sys.modules.get(getattr(fn, "__module__", "")), getattr(fn, "__name__", "")
    path = getattr(module, "__file__", None)
    if path and Path(path).is_file() and getattr(module, name, None) is fn and inspect.isfunction(fn):
        return Path(path), name
    return None, None


def check(exercise_id: str, fn, seed: int | None = None, hidden: bool = False) -> Report:
    task = registry.task(exercise_id)
    try:
        return grade(task, LocalRunner(task, fn), seed, hidden, name=getattr(fn, "__name__", "fn"), official=False)
    except GradingError as err:
        raise type(err)(str(err)).with_traceback(None) from None


@dataclass
class Trial:
    """One case, ready: `call` is all the submission side sees; the reference stays here."""
    case: Case
    call: submission.CaseCall
    ref: tuple
    scales: tuple


def prepare(task: Task, case: Case, seed: int, name: str, official: bool) -> Trial:
    """Inputs rounded to the case's dtype (on the CPU: rounding is the same everywhere) and the reference on them."""
    where = f'{task.id} failed on case "{case.name}" ({case.dtype})'
    again = (f"reproduce with: python -m course grade {task.id} --seed {seed}" if official else
             f'reproduce with: course.check("{task.id}", {name}, seed={seed})')
    rounded = tuple(to_float64(to_backend(task.backend, a, case.dtype, case.strided, device="cpu"))
                    for a in case.inputs)
    ref = task.reference(*rounded, **case.kwargs)
    scales = task.scale(*rounded, **case.kwargs) if task.scale else (None,) * len(ref)
    shapes = tuple(a.shape for a in rounded)
    out_shape = (tuple(task.out_shape(*shapes)) if task.out_shape else shapes[0]) if task.writes_out else None
    call = submission.CaseCall(rounded, case.dtype, case.strided, case.kwargs, out_shape, where, again)
    return Trial(case, call, ref, scales)


def grade(task: Task, runner, seed: int | None, hidden: bool, name: str, official: bool) -> Report:
    """Every case of `task` through `runner`; a GradingError for the first failing case, with the hint diagnosed
    from every failing case of its dtype."""
    seed = secrets.randbelow(2**31) if seed is None else seed
    ran, note = runner.begin()
    if not ran:
        return Report(task.id, ran=False, note=note)
    if task.backend == "triton" and not runner.interpreted:
        note = "\n    ".join(filter(None, [note, _interpreter_pass(task, runner, seed, name, official)]))
    report = Report(task.id, note=note)
    seeds = [seed] + ([secrets.randbelow(2**31)] if hidden else [])  # the hidden cases have a seed of their own
    dtypes = ("float32",) if runner.interpreted and backend.ON_GPU else task.graded_dtypes()
    cases = [(case, s) for s in seeds for case in task.cases(np.random.default_rng(s), dtypes)]
    start, launches, failures = time.perf_counter(), [], []
    for case, case_seed in cases:
        if failures and case.dtype != failures[0].trial.case.dtype:
            continue  # diagnosis looks at the failing dtype's cases only
        trial = prepare(task, case, case_seed, name, official)
        try:
            outcome = runner.run(trial)
            result = judge(task, trial, outcome)
        except GradingError:
            if failures:  # the first failure is the one reported; this case cannot add to its diagnosis
                break
            raise
        launches += [launch for launch in outcome.launches if launch not in launches]
        if isinstance(result, Mismatch):
            if not failures and _moves(runner, trial, outcome):
                result.extra = RACE
            failures.append(result)
            continue
        report.max_error[case.dtype] = max(report.max_error.get(case.dtype, 0.0), result)
        report.tolerances[case.dtype] = TOLERANCES[case.dtype]
        if case.tolerance:
            report.tolerances[f"{case.dtype}, {case.name}"] = case.tolerance
    if failures:
        raise GradingError(failures[0].message(_diagnosis(failures)))
    problem = runner.finish(launches)
    if problem:
        raise GradingError(f"{task.id}: every case passed in the CPU interpreter, but your kernel does not compile "
                           f"for a GPU (Triton, sm_90), so it would fail there:\n{problem}")
    report.cases, report.seconds = len(cases), time.perf_counter() - start
    if not official:
        report.note = "\n    ".join(filter(None, [report.note, OFFICIAL]))
    return report


def _interpreter_pass(task: Task, runner, seed: int, name: str, official: bool) -> str:
    """On a GPU, a Triton submission's float32 cases also run in the CPU interpreter (a child process), where every
    address a kernel touches is checked (course/memcheck.py): a load past a tensor's end that a GPU reads silently,
    and whose value the kernel happens to mask away, fails the grade here. Only such an address fails it: whether
    the outputs are right is for the GPU cases to judge (the interpreter of another Triton version may even fail
    on a correct kernel). Returns a note for the report where the check could not run or finish."""
    from .isolated import IsolatedRunner
    from .memcheck import OUTSIDE
    if runner.source is None:
        return "(the address check in the CPU interpreter needs your function in a file; it was skipped)"
    interpreter = IsolatedRunner(task, runner.source, runner.name, interpreter=True)
    try:
        grade(task, interpreter, seed, hidden=False, name=name, official=official)
    except GradingError as err:
        if OUTSIDE in str(err):
            raise GradingError(f"{err}\n  (found in the CPU interpreter, which checks every address a kernel "
                               f"touches; the GPU cases did not run)") from None
        return "(the address check in the CPU interpreter stopped before the last case; the GPU cases decided)"
    finally:
        interpreter.close()
    return ""


def _diagnosis(failures: list) -> str | None:
    """The hint the failing cases agree on. Never-written and out-of-bounds come first (the poison does not guess);
    otherwise each case votes for its hint, a case that cannot tell k bugs apart gives each 1/k, and the bugs with
    the most votes are named (several, joined by OR, where they tie)."""
    hints = [f.hint for f in failures if f.hint]
    written = [h for h in hints if "never written" in h or "past the end" in h or "before the start" in h]
    if written:
        return written[0]
    votes = {}
    for hint in hints:
        parts = hint.split(OR)
        for part in parts:
            votes[part] = votes.get(part, 0.0) + 1 / len(parts)
    if not votes:
        return failures[0].fallback
    most = max(votes.values())
    return OR.join(part for part, v in votes.items() if v >= most - 1e-9)


def _moves(runner, trial: Trial, first: submission.Outcome) -> bool:
    """On a GPU, after a failure: does a second run on the same inputs give other outputs? (A race's signature;
    the CPU interpreter runs programs one after another and cannot show one.)"""
    if runner.spec.backend == "numpy" or runner.interpreted:
        return False
    try:
        again = runner.run(trial)
    except GradingError:  # the first run's failure is the one to report
        return False
    return any(not np.array_equal(a, b, equal_nan=True) for a, b in zip(first.outputs, again.outputs))


@dataclass
class Mismatch:
    """A case whose output is wrong: the message without its hint, and the hint this case alone suggests."""
    lines: list
    tail: list
    hint: str | None
    fallback: str | None
    trial: Trial
    extra: str = ""

    def message(self, hint: str | None) -> str:
        lines = self.lines + ([f"  hint: {hint}"] if hint else []) + self.tail
        return "\n".join(lines + ([f"  and: {self.extra}"] if self.extra else []))


def judge(task: Task, trial: Trial, outcome: submission.Outcome):
    """The largest error as a share of the tolerance, or a Mismatch; a GradingError for outputs of the wrong
    number or shape."""
    call, ref = trial.call, trial.ref
    if outcome.stray:
        raise GradingError(f"{call.where}: your code {outcome.stray}\n  {call.again}")
    got = outcome.outputs
    if len(got) != len(ref):
        raise GradingError(f"{call.where}: expected {len(ref)} outputs ({', '.join(task.outputs)}), got {len(got)}.")
    worst = 0.0
    for name, g, r, unwritten, size in zip(task.outputs, got, ref, outcome.unwritten, trial.scales):
        if g.shape != r.shape:
            raise GradingError(f"{call.where}: output `{name}` has shape {g.shape}, expected {r.shape}.")
        with np.errstate(all="ignore"):
            result = _compare(task, trial, name, g, r, unwritten, size)
        if isinstance(result, Mismatch):
            return result
        worst = max(worst, result)
    return worst


def _compare(task, trial, name, got, ref, unwritten, size=None):
    case, call = trial.case, trial.call
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
    lines = [f"{call.where}: output `{name}` is wrong at {int(bad.sum())} of {bad.size} elements.",
             f"  first wrong element {list(first)} of shape {list(ref.shape)}: got {_pair(got[first], ref[first])}"]
    hint = None
    # Never-written is the diagnosis where it explains most of the error; a few poisoned elements among many wrong
    # ones are more likely a NaN that carried the poison's bits along from garbage the kernel read.
    if unwritten is not None and unwritten.any() and 2 * int(unwritten.sum()) >= int(bad.sum()):
        idx = [int(i) for i in np.argwhere(unwritten)[0]]
        hint = (f"{int(unwritten.sum())} elements were never written (first at {idx}): does the grid "
                f"cover every row, and does the mask reach the last, partial block?")
    case.output = name
    hint = hint or (task.hint(case, got, ref) if task.hint else None)
    tail = [f"  tolerance: |got - expected| <= {atol:g} + {rtol:g}·|expected| ({why})", f"  {call.again}"]
    return Mismatch(lines, tail, hint, _location_hint(bad), trial)




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
