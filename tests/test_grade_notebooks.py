"""`make grade-notebooks` (course/nbgrade.py): nbval runs a notebook and every grading cell becomes a row of the
table: pass, fail (with the grader's message) and not implemented; other failed cells are listed under it."""
import os
import subprocess
import sys
from pathlib import Path

import nbformat

from course import nbgrade

ROOT = Path(__file__).resolve().parent.parent
CELLS = [
    ("import numpy as np\nimport course", []),
    ("def stable_softmax(x):\n    e = np.exp(x - x.max(-1, keepdims=True))\n    return e / e.sum(-1, keepdims=True)\n\n"
     'course.check("w33.stable_softmax", stable_softmax)', ["grade"]),
    ("def qk_cost(bh, m, n, d, element_size):  # forgets to write S\n"
     "    return 2 * bh * m * n * d, bh * (m * d + n * d) * element_size\n\n"
     'course.check("w36.qk_cost", qk_cost)', ["grade"]),
    ("from course.exercises import w33_softmax as ex\n"
     'course.check("w33.online_softmax_update", ex.online_softmax_update)', ["grade"]),
    ("undefined_name + 1", []),
]


def test_the_table_has_one_row_per_grading_cell(tmp_path):
    week = tmp_path / "w99_fixture"
    week.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src, metadata={"tags": tags}) for src, tags in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, week / "d1_fixture.ipynb")
    env = {**os.environ, "COURSE_SOLUTIONS": "1"}  # make test's; the command must grade the exercise files anyway
    proc = subprocess.run([sys.executable, "-m", "course", "grade-notebooks", "--notebooks", str(tmp_path),
                           "--week", "99"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("exercise"))
    rows = [line.split() for line in lines[start + 2:lines.index("", start)]]
    assert rows == [["w33.stable_softmax", "pass", "w99_fixture/d1_fixture.ipynb"],
                    ["w36.qk_cost", "fail", "w99_fixture/d1_fixture.ipynb"],
                    ["w33.online_softmax_update", "not", "implemented", "w99_fixture/d1_fixture.ipynb"]], out
    assert "--- w36.qk_cost (w99_fixture/d1_fixture.ipynb, cell 2)\nw36.qk_cost failed" in out
    assert "1 other cells failed" in out and "d1_fixture.ipynb cell 4: NameError" in out
    assert out.rstrip().endswith("1 pass, 1 fail, 1 not implemented")


def test_status_of_a_check_that_only_compiled_is_not_run():
    record = {"outcome": "passed", "not_run": ["w33.block_softmax"], "exercises": ["w33.block_softmax"],
              "notebook": "n.ipynb", "ename": "", "evalue": ""}
    assert nbgrade.table([record]) == [("w33.block_softmax", "not run (needs a GPU)", "n.ipynb")]
