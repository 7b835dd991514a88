"""Mutants and variants: what proves a grader, both one-place edits of a reference solution.

Declared in tests/mutants/wNN_topic.py. A mutant, `Mutant(exercise, bug, old, new, hint=...)`, is a plausible
wrong solution the grader must reject with its hint; a variant, `Variant(exercise, change, old, new)`, is a correct
solution written another way (two passes instead of online, other block sizes, float64 inside, log-domain
updates) that it must accept. `old` must occur exactly once in solutions/wNN_topic.py: loading applies the edit to
a copy of the file, so an edit that no longer applies fails loudly instead of passing silently.
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


@dataclass(frozen=True)
class Variant:
    exercise: str   # "w33.online_softmax"
    change: str     # how it differs from the reference solution, still correct
    old: str
    new: str

    @property
    def name(self) -> str:
        return f"{self.exercise}: {self.change}"


def _declarations(week: str):
    path = ROOT / "tests" / "mutants" / f"{week}.py"
    spec = importlib.util.spec_from_file_location(f"_mutants_{week}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def declared(week: str) -> list[Mutant]:
    return _declarations(week).MUTANTS


def variants(week: str) -> list[Variant]:
    return getattr(_declarations(week), "VARIANTS", [])


def load(edit: Mutant | Variant, index: int):
    """Import the solution module with the edit applied; return the exercise's function."""
    week = registry.week_of(edit.exercise)
    text = (ROOT / "solutions" / f"{week}.py").read_text()
    count = text.count(edit.old)
    kind = type(edit).__name__.lower()
    if count != 1:
        raise ValueError(f"{kind} '{edit.name}': its `old` text occurs {count} times in solutions/{week}.py (need 1)")
    folder = Path(tempfile.mkdtemp(prefix=f"course-{kind}-"))
    path = folder / f"{kind}_{week}_{index}.py"
    path.write_text(text.replace(edit.old, edit.new))
    name = f"course_{kind}_{week}_{index}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return getattr(module, registry.task(edit.exercise).entry)


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


def accepts(variant: Variant, index: int) -> tuple[str, str]:
    """("accepted" | "REJECTED" | "skipped", detail) for a correct solution written another way."""
    fn = load(variant, index)
    try:
        report = check(variant.exercise, fn)
    except GradingError as err:
        return "REJECTED", str(err).splitlines()[0]
    return ("accepted", "") if report.ran else ("skipped", report.note)


def _accepts(args: tuple) -> tuple[str, int, str]:
    """(exercise, seed, "" or the first line of the rejection) for the reference solution on one seed."""
    exercise, seed = args
    from .grading import check
    solution = _solution(registry.week_of(exercise))
    try:
        check(exercise, getattr(solution, registry.task(exercise).entry), seed=seed)
    except GradingError as err:
        return exercise, seed, str(err).splitlines()[0]
    return exercise, seed, ""


def _solution(week: str):
    return registry.kernels(week)


def _one_thread() -> None:
    """A sweep's worker computes on one thread: the pool is the parallelism (16 workers of 16 torch threads each
    run several times slower than 16 of one)."""
    import torch
    torch.set_num_threads(1)


def sweep(exercises: list[str], seeds: int, jobs: int) -> dict:
    """False rejections of the reference solutions: exercise -> [(seed, message)] over seeds 0 … seeds − 1."""
    import multiprocessing
    work = [(e, s) for e in exercises for s in range(seeds)]
    found = {e: [] for e in exercises}
    with multiprocessing.get_context("fork").Pool(jobs, initializer=_one_thread) as pool:
        for exercise, seed, message in pool.imap_unordered(_accepts, work, chunksize=max(1, seeds // 8)):
            if message:
                found[exercise].append((seed, message))
    return found
