"""Grading a class: `python -m course gradebook SUBMISSIONS/`.

Owns the class's side of the official grade: SUBMISSIONS/ holds one folder per learner, each with that learner's
exercise files (wNN_topic.py, as in course/exercises/). Every (learner, exercise) is graded by
course/isolated.grade_exercise, so each submission runs in a fresh child process that never sees an expected
answer, `--jobs` at a time. Writes a CSV gradebook (learner, exercise, status, max error, seconds) and one feedback
file per learner with every failure's message. `--slurm` writes an sbatch job array instead (one learner per task,
each writing its own CSV; `--merge` joins them), for a class too large for one machine.
"""
import csv
import multiprocessing
import secrets
import shlex
import sys
import time
from pathlib import Path

from . import registry
from .stubs import ROOT

COLUMNS = ("learner", "exercise", "status", "max_error", "seconds")


def learners(folder: Path) -> list[str]:
    """The learners' folders in SUBMISSIONS/ (names starting with '.' or '_' are not learners)."""
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def _grade_one(work: tuple) -> dict:
    folder, learner, exercise_id, seed = work
    from .isolated import exercise_file, grade_exercise
    start = time.perf_counter()
    source = exercise_file(registry.week_of(exercise_id), folder=str(Path(folder) / learner))
    verdict = grade_exercise(exercise_id, source, seed, hidden=True)
    return {"learner": learner, "exercise": exercise_id, "status": verdict["status"],
            "max_error": f"{verdict['max_error']:.3g}" if "max_error" in verdict else "",
            "seconds": f"{time.perf_counter() - start:.1f}", "detail": verdict["detail"]}


def grade_class(folder: Path, selector: str, jobs: int, names: list[str] | None = None, progress=None) -> list[dict]:
    """One row per (learner, exercise), in learner then exercise order. The same seed for the whole class, so
    every learner meets the same cases (and a hidden seed of their own)."""
    seed = secrets.randbelow(2**31)
    work = [(str(folder), who, e, seed) for who in (names or learners(folder)) for e in registry.select(selector)]
    rows = []
    with multiprocessing.get_context("fork").Pool(max(1, jobs)) as pool:
        for row in pool.imap_unordered(_grade_one, work):
            rows.append(row)
            if progress:
                progress(row)
    order = {(w[1], w[2]): i for i, w in enumerate(work)}
    return sorted(rows, key=lambda r: order[(r["learner"], r["exercise"])])


def write(rows: list[dict], out: Path) -> None:
    """The gradebook CSV at `out`, and feedback/<learner>.txt beside it: every exercise's verdict, each failure's
    message in full."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    feedback = out.parent / "feedback"
    feedback.mkdir(exist_ok=True)
    for who in sorted({r["learner"] for r in rows}):
        mine = [r for r in rows if r["learner"] == who]
        passed = sum(r["status"] == "pass" for r in mine)
        lines = [f"{who}: {passed} of {len(mine)} exercises passed", ""]
        lines += [f"{r['exercise']:<32} {r['status']}" for r in mine]
        for r in mine:
            if r["status"] not in ("pass", "not run"):
                lines += ["", f"--- {r['exercise']}", r["detail"]]
        (feedback / f"{who}.txt").write_text("\n".join(lines) + "\n")


def merge(parts: Path, out: Path) -> list[dict]:
    """Join the per-learner CSVs a job array wrote (parts/*.csv) into one gradebook."""
    rows = []
    for part in sorted(parts.glob("*.csv")):
        with open(part, newline="") as f:
            rows += list(csv.DictReader(f))
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return rows


def slurm_script(folder: Path, selector: str, names: list[str]) -> str:
    """An sbatch job array: task i grades learner i into _gradebook/parts/<learner>.csv (and its feedback)."""
    listing = " ".join(shlex.quote(n) for n in names)
    where = shlex.quote(str(folder.resolve()))
    return "\n".join([
        "#!/bin/bash",
        "#SBATCH --job-name=gradebook",
        f"#SBATCH --array=0-{len(names) - 1}",
        "#SBATCH --cpus-per-task=1",
        "#SBATCH --time=00:30:00",
        f"LEARNERS=({listing})",
        'LEARNER="${LEARNERS[$SLURM_ARRAY_TASK_ID]}"',
        f"cd {shlex.quote(str(ROOT))}",
        f'{shlex.quote(sys.executable)} -m course gradebook {where} {shlex.quote(selector)} --learner "$LEARNER" '
        f'--jobs 1 --out {where}/_gradebook/parts/"$LEARNER".csv',
        f"# when every task has finished: python -m course gradebook {where} --merge",
        ""])
