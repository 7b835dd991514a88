"""Where the weeks and their graded tasks are listed. Owns: selector parsing ("w33", "w33.x", "all"), and the one
way into the course's kernels (`kernels`) for benchmarks, demos and notebooks."""
import functools
import importlib
import importlib.util
from pathlib import Path

# Every course/wNN_topic/ package with a tasks.py is a week: adding one touches nothing here.
WEEKS = tuple(sorted(p.parent.name for p in Path(__file__).resolve().parent.glob("w[0-9][0-9]_*/tasks.py")))


def week_tasks(week: str) -> dict:
    return importlib.import_module(f"course.{week}.tasks").TASKS


def all_tasks() -> dict:
    return {tid: t for week in WEEKS for tid, t in week_tasks(week).items()}


def task(exercise_id: str):
    tasks = all_tasks()
    if exercise_id not in tasks:
        raise KeyError(f"no exercise {exercise_id!r}; known: {', '.join(tasks)}")
    return tasks[exercise_id]


def week_of(exercise_id: str) -> str:
    """"w33_softmax" for "w33.online_softmax" (or for "w33")."""
    prefix = task(exercise_id).week if "." in exercise_id else exercise_id
    return next(w for w in WEEKS if w.startswith(prefix + "_"))


def select(selector: str) -> list[str]:
    """Exercise ids matching "all", a week ("w33") or one exercise ("w33.stable_softmax")."""
    ids = list(all_tasks())
    if selector == "all":
        return ids
    chosen = [i for i, t in all_tasks().items() if i == selector or t.week == selector]
    if not chosen:
        raise SystemExit(f"no exercise matches {selector!r}; try 'all', a week like 'w33', or one of: {', '.join(ids)}")
    return chosen


def edition() -> str:
    """"reference solutions" where solutions/ exists (the instructors' edition), else "your exercises"."""
    return "reference solutions" if importlib.util.find_spec("solutions") else "your exercises"


def kernels(week: str):
    """The course's kernels of `week` ("w37_flash_attention_core"): the reference solutions in the instructors'
    edition; in the learner's edition (no solutions/) the learner's own exercise module, whose unsolved exercises
    raise a one-line NotImplementedYet naming the exercise to solve first."""
    if edition() == "reference solutions":
        return importlib.import_module(f"solutions.{week}")
    return _Yours(importlib.import_module(f"course.exercises.{week}"), week)


class _Yours:
    """The learner's exercise module, as a demo sees it: a function whose code is, or reaches, a part still left to
    write raises a one-line NotImplementedYet naming the exercise to solve first (instead of running a stub and
    failing later with garbage)."""

    def __init__(self, module, week: str):
        self._module, self._week = module, week

    def __getattr__(self, name: str):
        from .submission import NotImplementedYet
        value = getattr(self._module, name)
        if not callable(value):  # data (a CUDA source string, a table of configs) runs nothing: shown as written
            return value
        todo = self._unsolved()
        reached = {name} | _names_reached(self._module, name)
        for exercise_id, regions in todo.items():
            if reached & regions:
                @functools.wraps(value)  # its source and name stay the learner's (show_source, inspect)
                def unsolved(*args, **kwargs):
                    raise NotImplementedYet(f"this cell runs your `{name}`: solve {exercise_id} first")
                return unsolved
        return value

    def _unsolved(self) -> dict:
        """{exercise id: names of its parts} for the exercises of the week whose code holds the stub marker."""
        from .stubs import unfinished
        todo = {}
        for exercise_id, task in week_tasks(self._week).items():
            parts = {r for r in task.regions if hasattr(self._module, r)}
            if any(unfinished(getattr(self._module, r)) for r in parts):
                todo[exercise_id] = parts | {task.entry}
        return todo


def _names_reached(module, name: str, seen: set | None = None) -> set:
    """The module-level names that `name`'s code uses, and theirs in turn (a launcher reaches its kernels)."""
    seen = set() if seen is None else seen
    value = getattr(module, name, None)
    if isinstance(value, type):  # a class (an autograd.Function): what its methods use
        functions = [getattr(f, "__func__", f) for f in vars(value).values()]
    else:
        functions = [getattr(getattr(value, "fn", value), "__wrapped__", getattr(value, "fn", value))]  # Triton, wraps
    codes = [f.__code__ for f in functions if hasattr(f, "__code__")]
    codes += [c for code in codes for c in code.co_consts if hasattr(c, "co_names")]  # nested functions, lambdas
    for used in {n for code in codes for n in code.co_names}:
        if used not in seen and hasattr(module, used):
            seen.add(used)
            _names_reached(module, used, seen)
    return seen
