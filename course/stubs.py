"""Stubs are generated from the solutions: one source, no drift.

`solutions/wNN_topic.py` marks the learner's part with `### BEGIN SOLUTION` / `### END SOLUTION`
(Python) or `// BEGIN SOLUTION` / `// END SOLUTION` (inside CUDA source strings). The stub file
`course/exercises/wNN_topic.py` is the same file with each marked part replaced by a
`YOUR CODE HERE` line. `python -m course stubs` writes them; tests/test_stubs.py fails on drift.
"""
import inspect
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = "YOUR CODE HERE"
HEADER = ('"""Your exercises. Generated from solutions/{name}.py by `python -m course stubs`.\n\n'
          "Replace every `{marker}` line with your code, then run the grading cell in the notebook\n"
          "(or `python -m course grade {week}.<exercise>`). The reference solutions are in solutions/{name}.py:\n"
          "try first, peek later.\n\"\"\"")
_REGION = re.compile(
    r"^(?P<indent>[ \t]*)(?P<c>###|//) BEGIN SOLUTION[^\n]*\n.*?^[ \t]*(?P=c) END SOLUTION[^\n]*\n",
    re.MULTILINE | re.DOTALL)


def make_stub(solution_text: str, name: str) -> str:
    """The stub text for solution file `name` (e.g. "w33_softmax")."""
    if not solution_text.startswith('"""'):
        raise ValueError(f"solutions/{name}.py must start with a module docstring")
    body = solution_text[solution_text.index('"""', 3) + 3:]  # the solution's docstring is replaced
    body = _REGION.sub(lambda m: f"{m['indent']}{'#' if m['c'] == '###' else '//'} {MARKER}\n", body)
    return HEADER.format(name=name, marker=MARKER, week=name.split("_")[0]) + body


def stub_path(name: str) -> Path:
    return ROOT / "course" / "exercises" / f"{name}.py"


def solution_names() -> list[str]:
    return sorted(p.stem for p in (ROOT / "solutions").glob("w*_*.py"))


def write_stubs() -> list[Path]:
    written = []
    for name in solution_names():
        text = make_stub((ROOT / "solutions" / f"{name}.py").read_text(), name)
        path = stub_path(name)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def source_of(obj) -> str:
    """Source text of a function, a Triton kernel or a CUDA source string."""
    if isinstance(obj, str):
        return obj
    fn = getattr(obj, "fn", obj)  # triton.JITFunction wraps the Python function in .fn
    return inspect.getsource(fn)


def unfinished(obj) -> bool:
    """True while the learner's code still holds the stub marker."""
    return MARKER in source_of(obj)
