"""Grading the learner's own notebooks (`make grade-notebooks`): nbval runs each notebook top to bottom in a fresh
kernel, and every grading cell (`course.check("w33.triton_softmax", ...)`) becomes one row of a table.

Owns: the pytest plugin (`pytest -p course.nbgrade`) that writes one JSON line per notebook cell to the file named by
COURSE_NBGRADE_CELLS (notebook, cell index, outcome, the error's name and message, the exercises the cell checks,
whether a check only compiled), `run` (nbval in a child process, the cells' verdicts back), and the per-exercise table.
The release test (tests/test_release.py) reads the same per-cell verdicts.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CELLS_ENV = "COURSE_NBGRADE_CELLS"
CHECK = re.compile(r"""course\.check\(\s*["'](w\d\d\.\w+)["']""")
NOT_IMPLEMENTED = "NotImplementedYet"


# ---------------------------------------------------------------- the plugin, in the pytest process
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    path = os.environ.get(CELLS_ENV)
    if not path or not hasattr(item, "cell_num") or (report.when != "call" and report.passed):
        return
    outputs = getattr(item, "test_outputs", None) or []
    error = next((o for o in outputs if o.get("output_type") == "error"), None)
    if error is not None:
        ename, evalue = error["ename"], error["evalue"]
    elif report.failed:  # a timeout, a dead kernel: no error output from the cell itself
        ename, evalue = "CellError", str(call.excinfo.value) if call.excinfo else report.longreprtext[-300:]
    else:
        ename = evalue = ""
    text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    exercises = CHECK.findall(item.cell.source)
    cells = getattr(item.parent, "nb", None)
    index = next((i for i, c in enumerate(cells.cells) if c is item.cell), None) if cells else None
    # cell: nbval's "Cell N" (code cells counted from 0); index: the position among all the notebook's cells
    record = {"notebook": Path(str(item.fspath)).as_posix(), "cell": item.cell_num, "index": index,
              "outcome": report.outcome,
              "ename": ename, "evalue": evalue, "exercises": exercises,
              "not_run": [e for e in exercises if re.search(rf"^~ {re.escape(e)}:", text, re.MULTILINE)]}
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


# ---------------------------------------------------------------- running nbval, in the caller's process
def run(paths: list, cwd: Path, env: dict | None = None, jobs: int = 1, timeout: float | None = None):
    """nbval (`--nbval-lax`) on `paths` in a child pytest: (exit code, its output, one record per cell, notebooks
    named relative to `cwd` where they lie inside it)."""
    with tempfile.TemporaryDirectory() as tmp:
        cells = Path(tmp) / "cells.jsonl"
        env = dict(os.environ if env is None else env, **{CELLS_ENV: str(cells)})
        env.setdefault("MPLBACKEND", "Agg")
        parallel = ["-n", str(jobs), "--dist", "loadfile"] if jobs > 1 else []
        proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "course.nbgrade", "-p", "no:cacheprovider",
                               "--nbval-lax", "-q", "-rN", *parallel, *map(str, paths)],
                              cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        records = [json.loads(line) for line in cells.read_text().splitlines()] if cells.exists() else []
    root = Path(cwd).resolve()
    for r in records:
        path = Path(r["notebook"]).resolve()
        r["notebook"] = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()
    return proc.returncode, proc.stdout + proc.stderr, sorted(records, key=lambda r: (r["notebook"], r["cell"]))


def status(record: dict) -> str:
    if record["outcome"] == "passed":
        return "not run (needs a GPU)" if record["not_run"] else "pass"
    if record["outcome"] == "skipped":
        return "skipped"
    return "not implemented" if record["ename"] == NOT_IMPLEMENTED else "fail"


def table(records: list[dict]) -> list[tuple[str, str, str]]:
    """(exercise, status, notebook) for every grading cell, in notebook order."""
    return [(e, status(r), r["notebook"]) for r in records for e in r["exercises"]]


def notebooks(folder: Path, week: str | None) -> list[Path]:
    """`folder`'s week folders (one week: "33" or "w33"), or `folder` itself."""
    folder = Path(folder)
    if not week:
        return [folder]
    prefix = "w" + str(week).lstrip("w") + "_"
    found = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith(prefix))
    if not found:
        raise SystemExit(f"grade-notebooks: no {prefix}* folder in {folder}; there are: "
                         f"{', '.join(sorted(p.name for p in folder.iterdir() if p.is_dir()))}")
    return found


def main(folder: Path, week: str | None, jobs: int = 1) -> int:
    """Run the notebooks of `folder` against the exercise files in course/exercises/ (never the solutions) and print
    the table; exit code 1 unless every grading cell passed."""
    from .__main__ import _table
    env = {k: v for k, v in os.environ.items() if k != "COURSE_SOLUTIONS"}
    folder = Path(folder).resolve()
    paths = notebooks(folder, week)
    base = ROOT if folder.is_relative_to(ROOT) else folder
    print(f"running {', '.join(p.relative_to(base).as_posix() or '.' for p in paths)} with nbval, every cell top to "
          f"bottom (a few minutes a week) ...", flush=True)
    code, output, records = run(paths, cwd=base, env=env, jobs=jobs)
    if not records:
        print(output[-3000:])
        raise SystemExit("grade-notebooks: nbval reported no cells (its output is above)")
    rows = table(records)
    print(_table(rows, ("exercise", "status", "notebook")) if rows else "no grading cells (course.check) ran")
    for r in records:
        if r["exercises"] and status(r) == "fail":
            print(f"\n--- {', '.join(r['exercises'])} ({r['notebook']}, cell {r['cell']})\n{r['evalue']}")
    others = [r for r in records if not r["exercises"] and r["outcome"] == "failed"]
    if others:
        print(f"\n{len(others)} other cells failed (a lesson that runs an exercise you have not solved yet stops "
              f"with NotImplementedYet):")
        for r in others:
            first = r["evalue"].splitlines()[0] if r["evalue"] else ""
            print(f"  {r['notebook']} cell {r['cell']}: {r['ename']}: {first}")
    counts = {s: sum(row[1] == s for row in rows) for s in ("pass", "fail", "not implemented", "not run (needs a GPU)")}
    print("\n" + ", ".join(f"{n} {s}" for s, n in counts.items() if n or s in ("pass", "fail")))
    return 0 if rows and all(row[1] in ("pass", "not run (needs a GPU)") for row in rows) else 1
