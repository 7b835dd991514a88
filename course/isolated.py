"""The official grade: the submission runs in a fresh child process that never sees an expected answer.

Owns the parent-child protocol. The parent (`python -m course grade`) draws the seeds, builds every case, rounds
the inputs and computes the references; it sends the child one case at a time (inputs only) and judges the outputs
the child sends back (course/grading.py). The child imports the learner's exercise module with the course's
answers (references, tasks, solutions, the grader) made unimportable, runs the submission through
course/submission.py and answers over a private pipe: not stdout, which the learner's code can print to.

Messages are a JSON header plus NumPy arrays in .npy form, read with allow_pickle=False: nothing the child sends can
run code in the parent.
"""
import importlib
import importlib.abc
import io
import json
import os
import select
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from . import submission
from .submission import FORBIDDEN, TIMEOUT_S, GradingError, NotImplementedYet

ROOT = Path(__file__).resolve().parent.parent
ANSWER_MARGIN_S = 60  # beyond the child's own timeout, before the parent gives up on it


# ---- messages -----------------------------------------------------------------------------------------------------

def _pack(obj) -> bytes:
    arrays = []

    def encode(x):
        if isinstance(x, np.ndarray):
            arrays.append(x)
            return {"__array__": len(arrays) - 1}
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, dict):
            return {k: encode(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return {"__tuple__": [encode(v) for v in x]} if isinstance(x, tuple) else [encode(v) for v in x]
        return x
    header = json.dumps(encode(obj)).encode()
    blobs = []
    for a in arrays:
        buffer = io.BytesIO()
        np.save(buffer, a, allow_pickle=False)
        blobs.append(buffer.getvalue())
    parts = [header, *blobs]
    return struct.pack("<I", len(parts)) + b"".join(struct.pack("<Q", len(p)) + p for p in parts)


def _unpack(data: bytes):
    count, at, parts = struct.unpack_from("<I", data)[0], 4, []
    for _ in range(count):
        size = struct.unpack_from("<Q", data, at)[0]
        parts.append(data[at + 8:at + 8 + size])
        at += 8 + size
    arrays = [np.load(io.BytesIO(p), allow_pickle=False) for p in parts[1:]]

    def decode(x):
        if isinstance(x, dict):
            if "__array__" in x:
                return arrays[x["__array__"]]
            if "__tuple__" in x:
                return tuple(decode(v) for v in x["__tuple__"])
            return {k: decode(v) for k, v in x.items()}
        if isinstance(x, list):
            return [decode(v) for v in x]
        return x
    return decode(json.loads(parts[0]))


def _write(fd: int, obj) -> None:
    data = _pack(obj)
    view = memoryview(struct.pack("<Q", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, size: int, deadline_s: float | None) -> bytes:
    chunks, left = [], size
    while left:
        if deadline_s is not None and not select.select([fd], [], [], deadline_s)[0]:
            raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read(fd: int, deadline_s: float | None = None):
    size = struct.unpack("<Q", _read_exact(fd, 8, deadline_s))[0]
    return _unpack(_read_exact(fd, size, deadline_s))


# ---- the parent's side --------------------------------------------------------------------------------------------

class IsolatedRunner:
    """grading.LocalRunner's three methods, each answered by a child process that holds the submission."""

    def __init__(self, task, source: Path, name: str | None = None, interpreter: bool = False):
        """`interpreter`: on a GPU machine, run the submission in Triton's CPU interpreter instead (its addresses
        are checked there: course/memcheck.py)."""
        from . import backend
        from .grading import spec_of
        self.spec, self.task = spec_of(task), task
        self.source, self.name = source, name or task.entry
        self.interpreted = interpreter or not backend.ON_GPU
        env = {k: v for k, v in os.environ.items() if k not in ("COURSE_SOLUTIONS", "PYTHONSTARTUP")}
        if interpreter:
            env.update(COURSE_BACKEND="cpu", CUDA_VISIBLE_DEVICES="")
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "course.isolated", str(to_child), str(from_child), str(source),
             self.name], pass_fds=(to_child, from_child), env=env, cwd=ROOT,
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        os.close(to_child)
        os.close(from_child)

    def _ask(self, request: dict):
        try:
            _write(self._out, request)
            answer = _read(self._in, TIMEOUT_S + ANSWER_MARGIN_S)
        except TimeoutError:
            self.close()
            raise GradingError(f"{self.task.id}: no answer within {TIMEOUT_S + ANSWER_MARGIN_S} s: an endless loop, "
                               f"or a kernel that waits for something that never happens?") from None
        except (EOFError, BrokenPipeError):
            raise GradingError(self._crash()) from None
        if "error" in answer:
            kind = NotImplementedYet if answer["error"] == "not implemented" else GradingError
            raise kind(answer["message"])
        return answer

    def _crash(self) -> str:
        code = self.proc.wait(timeout=30)
        self._log.seek(0)
        tail = self._log.read().decode(errors="replace").strip().splitlines()[-6:]
        why = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        shown = "\n    ".join(tail) if tail else "(it printed nothing)"
        return (f"{self.task.id}: the process running your code died ({why}) before it answered: a crash in a "
                f"kernel (an out-of-bounds access, a bad pointer) or in code it calls. Its last output:\n    {shown}")

    def begin(self) -> tuple[bool, str]:
        s = self.spec
        answer = self._ask({"do": "begin", "spec": [s.exercise, s.backend, list(s.regions), list(s.dtypes),
                                                    list(s.banned), s.writes_out, s.entry, s.week,
                                                    list(s.builds_on)]})
        return answer["ran"], answer["note"]

    def run(self, trial) -> submission.Outcome:
        c = trial.call
        answer = self._ask({"do": "run", "inputs": tuple(c.inputs), "dtype": c.dtype, "strided": c.strided,
                            "kwargs": c.kwargs, "out_shape": c.out_shape, "where": c.where, "again": c.again})
        from .memcheck import Launch
        launches = [Launch(p, k, tuple(map(tuple, t)), None if ce is None else tuple(map(tuple, ce)), w)
                    for p, k, t, ce, w in answer["launches"]]
        unwritten = [None if u is None else np.asarray(u, dtype=bool) for u in answer["unwritten"]]
        return submission.Outcome([np.asarray(o, dtype=np.float64) for o in answer["outputs"]], unwritten,
                                  answer["stray"], launches)

    def finish(self, launches: list) -> str:
        from . import backend, triton_ptx
        if backend.ON_GPU:
            if self.task.gpu_check and not self.interpreted:
                self._ask({"do": "gpu_check"})
            return ""  # the GPU compiled every kernel already
        return triton_ptx.gpu_compile_errors(launches)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()


def exercise_file(week: str, solutions: bool = False, folder: str | None = None) -> Path:
    """The file a week's exercises are graded from: the learner's (course/exercises/), the reference solutions, or
    a folder holding someone's wNN_topic.py files (a class's submissions)."""
    base = Path(folder) if folder else ROOT / ("solutions" if solutions else "course/exercises")
    return (base / f"{week}.py").resolve()


def grade_exercise(exercise_id: str, source: Path, seed: int | None = None, hidden: bool = True) -> dict:
    """The official verdict of one exercise graded from the exercise file `source`, as a JSON-able dict."""
    from . import registry
    from .grading import grade
    task = registry.task(exercise_id)
    if not source.exists():
        return {"status": "missing", "detail": f"{exercise_id}: no file {source}"}
    runner = IsolatedRunner(task, source)
    try:
        report = grade(task, runner, seed, hidden, name=task.entry, official=True)
    except NotImplementedYet as err:
        return {"status": "not implemented", "detail": str(err)}
    except GradingError as err:
        return {"status": "FAIL", "detail": str(err)}
    finally:
        runner.close()
    if not report.ran:
        return {"status": "not run", "detail": report.note}
    worst = max(report.max_error.values(), default=0.0)
    return {"status": "pass", "max_error": worst, "detail": f"{report.cases} cases"}


# ---- the child's side ---------------------------------------------------------------------------------------------

class _Refuse(importlib.abc.MetaPathFinder):
    """Makes the course's answers unimportable in the child, whatever import statement or function asks; the
    kernels of the weeks a task builds on (Spec.builds_on: `allow`) excepted, which its exercise calls through
    course.kernels."""

    def __init__(self):
        self.allowed = set()

    def allow(self, weeks) -> None:
        self.allowed = {f"solutions.{week}" for week in weeks} | ({"solutions"} if weeks else set())

    def find_spec(self, fullname, path=None, target=None):
        if FORBIDDEN.match(fullname) and fullname not in self.allowed:
            raise ImportError(f"{fullname} is part of the course's own answers (references, tasks, solutions, the "
                              f"grader): exercise code may not import it. The exercise asks you to compute it "
                              f"yourself.")
        return None


def _serve(fd_in: int, fd_out: int, source: str, name: str) -> None:
    refuse = _Refuse()
    sys.meta_path.insert(0, refuse)
    week = Path(source).stem
    state = {}

    def load():
        if "fn" not in state:
            try:
                module = _import_exercise(source, week)
            except ImportError as exc:
                raise GradingError(f"{week}: your exercise module could not be imported: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - the learner's module raised while importing
                raise GradingError(f"{week}: your exercise module raised {type(exc).__name__} while being "
                                   f"imported: {exc}") from None
            state["fn"] = getattr(module, name)
        return state["fn"]

    spec = None
    while True:
        try:
            request = _read(fd_in)
        except EOFError:
            return
        try:
            if request["do"] == "begin":
                spec = submission.Spec(*request["spec"])
                refuse.allow(spec.builds_on)  # before the exercise file is imported: it may import their kernels
            fn = load()
            if request["do"] == "begin":
                ran, note = submission.begin(spec, fn)
                answer = {"ran": ran, "note": note}
            elif request["do"] == "run":
                outcome = submission.run(spec, fn, submission.CaseCall(
                    request["inputs"], request["dtype"], request["strided"], request["kwargs"],
                    request["out_shape"], request["where"], request["again"]))
                answer = {"outputs": outcome.outputs, "unwritten": outcome.unwritten, "stray": outcome.stray,
                          "launches": [[la.path, la.kernel, la.types, la.constexprs, la.num_warps]
                                       for la in outcome.launches]}
            else:  # gpu_check: after every case, the task's check at scale (it compares with PyTorch, not ours)
                sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Refuse)]
                from . import registry
                submission.run_gpu_check(spec.exercise, registry.task(spec.exercise).gpu_check, fn)
                answer = {}
        except NotImplementedYet as exc:
            answer = {"error": "not implemented", "message": str(exc)}
        except GradingError as exc:
            answer = {"error": "fail", "message": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a failure of ours: one paragraph, no traceback
            answer = {"error": "fail", "message": f"the grader could not run this exercise ({type(exc).__name__}: "
                                                  f"{exc}); please report it."}
        _write(fd_out, answer)


def _import_exercise(source: str, week: str):
    """The exercise file loaded as `course.exercises.<week>`, whatever folder it comes from."""
    import importlib.util
    name = f"course.exercises.{week}"
    spec = importlib.util.spec_from_file_location(name, source)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
