"""Mutants: plausible wrong solutions the graders must reject.

A mutant is a one-place edit of a reference solution, declared in tests/mutants/wNN_topic.py as
`Mutant(exercise, bug, old, new)`: `bug` names the mistake (missing max-subtraction, ...), `old`
must occur exactly once in solutions/wNN_topic.py. Loading applies the edit to a copy of the file,
so a mutant that no longer applies to the solution fails loudly instead of passing silently.
"""
import importlib.util
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import registry
from .grading import GradingError, check

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    exercise: str   # "w33.stable_softmax"
    bug: str        # what is wrong, in the words a reviewer would use
    old: str
    new: str
    needs_gpu: bool = False  # the bug shows only on a GPU (memory that grows as N², a race): skipped without one
    hint: str = ""           # words the rejection's hint must contain: the grader names this bug, not another

    @property
    def name(self) -> str:
        return f"{self.exercise}: {self.bug}"


def declared(week: str) -> list[Mutant]:
    path = ROOT / "tests" / "mutants" / f"{week}.py"
    spec = importlib.util.spec_from_file_location(f"_mutants_{week}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MUTANTS


def load(mutant: Mutant, index: int):
    """Import the solution module with the mutant's edit applied; return the exercise's function."""
    week = registry.week_of(mutant.exercise)
    text = (ROOT / "solutions" / f"{week}.py").read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise ValueError(f"mutant '{mutant.name}': its `old` text occurs {count} times in solutions/{week}.py (need 1)")
    folder = Path(tempfile.mkdtemp(prefix="course-mutant-"))
    path = folder / f"mutant_{week}_{index}.py"
    path.write_text(text.replace(mutant.old, mutant.new))
    name = f"course_mutant_{week}_{index}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return getattr(module, mutant.exercise.split(".")[1])


def verdict(mutant: Mutant, index: int) -> tuple[str, str]:
    """("rejected" | "rejected without its hint" | "ACCEPTED" | "skipped", detail)."""
    from .backend import ON_GPU
    if mutant.needs_gpu and not ON_GPU:
        return "skipped", "the grader sees this bug only on a GPU"
    fn = load(mutant, index)
    try:
        report = check(mutant.exercise, fn)
    except GradingError as err:
        message = str(err)
        if mutant.hint and mutant.hint not in message:
            return "rejected without its hint", f"expected a hint with {mutant.hint!r}; got: {message}"
        return "rejected", message.splitlines()[0]
    if not report.ran:
        return "skipped", report.note
    return "ACCEPTED", "the grader passed this wrong solution"


def _accepts(args: tuple) -> tuple[str, int, str]:
    """(exercise, seed, "" or the first line of the rejection) for the reference solution on one seed."""
    exercise, seed = args
    from .grading import check
    solution = _solution(registry.week_of(exercise))
    try:
        check(exercise, getattr(solution, exercise.split(".")[1]), seed=seed)
    except GradingError as err:
        return exercise, seed, str(err).splitlines()[0]
    return exercise, seed, ""


def _solution(week: str):
    import importlib
    return importlib.import_module(f"solutions.{week}")


def sweep(exercises: list[str], seeds: int, jobs: int) -> dict:
    """False rejections of the reference solutions: exercise -> [(seed, message)] over seeds 0 … seeds − 1."""
    import multiprocessing
    work = [(e, s) for e in exercises for s in range(seeds)]
    found = {e: [] for e in exercises}
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        for exercise, seed, message in pool.imap_unordered(_accepts, work, chunksize=max(1, seeds // 8)):
            if message:
                found[exercise].append((seed, message))
    return found
