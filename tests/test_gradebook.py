"""Grading a class: learners' copies of week 33, each the reference solution with one known bug (a mutant) or none,
graded in isolation. Every verdict must be right: the bug's exercise fails with the bug's hint, the rest pass, and
CUDA exercises on a machine without a GPU are "not run". COURSE_CLASS_SIZE=30 runs the full class."""
import csv
import os
import subprocess
import sys

import course
from course import mutants, registry
from course.stubs import ROOT

WEEK = "w33_softmax"


def make_class(folder, size):
    """Learner i carries mutant i·k (spread over the week's exercises); learner 0 carries none."""
    declared = mutants.declared(WEEK)
    text = (ROOT / "solutions" / f"{WEEK}.py").read_text()
    step = max(1, len(declared) // max(1, size - 1))
    expected = {}
    for i in range(size):
        who = folder / f"learner{i:02d}"
        who.mkdir()
        bug = declared[(i - 1) * step % len(declared)] if i else None
        (who / f"{WEEK}.py").write_text(text.replace(bug.old, bug.new) if bug else text)
        expected[who.name] = bug
    return expected


def test_a_class_gets_the_right_verdict_for_every_learner_and_exercise(tmp_path):
    size = int(os.environ.get("COURSE_CLASS_SIZE", "5"))
    expected = make_class(tmp_path, size)
    done = subprocess.run([sys.executable, "-m", "course", "gradebook", str(tmp_path), "w33", "-j", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(tmp_path / "_gradebook" / "gradebook.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == size * len(registry.select("w33"))
    for row in rows:
        bug, task = expected[row["learner"]], registry.task(row["exercise"])
        if task.backend == "cuda" and not course.ON_GPU:
            right = "not run"
        else:
            right = "FAIL" if bug and bug.exercise == row["exercise"] else "pass"
        assert row["status"] == right, (row, bug and bug.name)
        feedback = (tmp_path / "_gradebook" / "feedback" / f"{row['learner']}.txt").read_text()
        if right == "FAIL" and bug.hint:
            assert bug.hint in feedback, (row["learner"], bug.name)


def test_a_job_array_script_for_a_large_class(tmp_path):
    make_class(tmp_path, 3)
    done = subprocess.run([sys.executable, "-m", "course", "gradebook", str(tmp_path), "w33", "--slurm"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    script = (tmp_path / "_gradebook" / "gradebook.sbatch").read_text()
    assert done.returncode == 0 and "#SBATCH --array=0-2" in script and "--learner" in script
