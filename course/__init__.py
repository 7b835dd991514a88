"""DL Kernels & Attention: the package every notebook imports first.

`import course` picks the backend (GPU, or the Triton interpreter on CPU) before any kernel
is defined, and, when COURSE_SOLUTIONS=1 (`make solutions`, `make test`), makes
`course.exercises.<week>` load the reference solutions instead of the learner's stubs.
"""
import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

from . import backend, bench, roofline  # noqa: F401 - notebooks use course.bench, course.roofline
from .backend import DEVICE, ON_GPU, banner
from .registry import kernels  # the one way to the course's kernels: solutions/, or the learner's own exercises

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS_MODE = os.environ.get("COURSE_SOLUTIONS") == "1"


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
    that actually runs instead of a copy of it."""
    from .stubs import source_of
    from IPython.display import Code, display
    text = source_of(obj)
    language = "cuda" if isinstance(obj, str) else "python"
    display(Code(text, language="cpp" if language == "cuda" else "python"))


__all__ = ["DEVICE", "ON_GPU", "banner", "backend", "bench", "roofline", "check", "kernels", "show_source",
           "SOLUTIONS_MODE"]
