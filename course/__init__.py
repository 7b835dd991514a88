"""DL Kernels & Attention: the package every notebook imports first.

`import course` picks the backend (GPU, or the Triton interpreter on CPU) before any kernel
is defined, and, when COURSE_SOLUTIONS=1 (`make solutions`, `make test`), makes
`course.exercises.<week>` load the reference solutions instead of the learner's stubs.
"""
import importlib.abc
import importlib.util
import os
import sys
import warnings
from pathlib import Path

from . import backend, bench, roofline  # noqa: F401 - notebooks use course.bench, course.roofline
from .backend import DEVICE, ON_GPU, banner
from .registry import kernels  # the one way to the course's kernels: solutions/, or the learner's own exercises

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS_MODE = os.environ.get("COURSE_SOLUTIONS") == "1"

# The lessons look rows up by label in small unsorted tables of recorded results; pandas' note that such lookups
# are slower on huge tables is noise there (and stderr fails the site build).
warnings.filterwarnings("ignore", message="indexing past lexsort depth")


class _SolutionsFinder(importlib.abc.MetaPathFinder):
    """Serve `course.exercises.wNN_topic` from `solutions/wNN_topic.py`."""

    def find_spec(self, fullname, path=None, target=None):
        prefix = "course.exercises."
        if not fullname.startswith(prefix):
            return None
        source = ROOT / "solutions" / (fullname[len(prefix):] + ".py")
        return importlib.util.spec_from_file_location(fullname, source) if source.exists() else None


if SOLUTIONS_MODE and not any(isinstance(f, _SolutionsFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SolutionsFinder())


def check(exercise_id: str, fn, **kwargs):
    """Grade `fn` as exercise `exercise_id` (e.g. "w33.stable_softmax"). Raises a GradingError
    (an AssertionError) that says what is wrong; returns a report when every case passes."""
    from .grading import check as _check
    return _check(exercise_id, fn, **kwargs)


def show_source(obj) -> None:
    """Print the source of a course kernel, CUDA string or function, so notebooks show the code
    that actually runs instead of a copy of it. With COURSE_SHOW=stubs (the learner's edition of the
    site, built with the solutions) an object of an exercise module is shown as its stub instead:
    the same-named definition in course/exercises/, with its `YOUR CODE HERE` lines."""
    from IPython.display import Code, display
    from .stubs import source_of
    found = _exercise_name(obj)
    if found and os.environ.get("COURSE_SHOW") == "stubs":
        text = _stub_source(*found)
    elif found and _yours(obj):  # a demo's unsolved exercise (course.kernels): the learner's own code
        text = source_of(getattr(importlib.import_module(f"course.exercises.{found[0]}"), found[1]))
    else:
        text = None
    text = text if text is not None else source_of(obj)
    display(Code(text, language="cpp" if isinstance(obj, str) else "python"))


_EXERCISE_MODULE = r"^(?:course\.exercises|solutions)\.(w\d\d_\w+)$"


def _yours(obj) -> bool:
    return getattr(obj, "__qualname__", "") == "_Yours.__getattr__.<locals>.unsolved"


def _exercise_name(obj) -> tuple[str, str] | None:
    """(week, name) of `obj` in an exercise module (course.exercises.wNN_topic or solutions.wNN_topic), else None."""
    import inspect
    import re
    from . import registry
    if _yours(obj):  # course.kernels(week).name while `name` is unsolved: the stand-in that raises
        names = inspect.getclosurevars(obj).nonlocals
        return registry.week_of(names["exercise_id"]), names["name"]
    inner = obj
    while hasattr(inner, "fn"):  # triton's JITFunction / Autotuner wrap the Python function in .fn
        inner = inner.fn
    candidates = [(m, module) for m, module in list(sys.modules.items()) if re.match(_EXERCISE_MODULE, m)]
    own = getattr(inner, "__module__", None)
    for module_name, module in sorted(candidates, key=lambda c: c[0] != own):
        names = [k for k, v in vars(module).items() if v is obj]
        if names:
            name = getattr(inner, "__name__", None)
            return re.match(_EXERCISE_MODULE, module_name)[1], name if name in names else names[0]
    return None


def _stub_source(week: str, name: str) -> str | None:
    """The definition of `name` in course/exercises/<week>.py as show_source would print it, or None."""
    import ast
    from .stubs import stub_path
    text = stub_path(week).read_text()
    lines = text.splitlines(keepends=True)
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            start, end = min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno
            while end < len(lines) and (not lines[end].strip() or lines[end].startswith((" ", "\t"))):
                end += 1  # the body's last lines may be comments: `    # YOUR CODE HERE`
            return "".join(lines[start - 1:end]).rstrip() + "\n"
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError):
                value = None
            return value if isinstance(value, str) else "".join(lines[node.lineno - 1:node.end_lineno])
    return None


__all__ = ["DEVICE", "ON_GPU", "banner", "backend", "bench", "roofline", "check", "kernels", "show_source",
           "SOLUTIONS_MODE"]
