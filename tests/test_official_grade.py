"""The official grade (`python -m course grade`) cannot be fooled by the code it grades: each submission below
cheats or crashes in its own way and must be failed with a message naming the cause."""
import subprocess
import sys
import textwrap

import pytest

import course
from course import isolated
from course.stubs import ROOT

WRONG = "    return np.zeros_like(x)\n"
CHEATS = {
    "imports the course's reference": (
        "from course.w33_softmax import reference\n\n"
        "def stable_softmax(x):\n    return reference.softmax(x)\n", "course's own answers"),
    "imports the reference inside the function": (
        "def stable_softmax(x):\n    import importlib\n"
        "    return importlib.import_module('course.w33_softmax.reference').softmax(x)\n", "course's own answers"),
    "patches NumPy's comparison functions at import": (
        "np.allclose = lambda *a, **k: True\nnp.abs = lambda x: x * 0\nnp.isfinite = lambda x: x == x\n\n"
        "def stable_softmax(x):\n" + WRONG, "is wrong at"),
    "prints a verdict the parent might trust": (
        "def stable_softmax(x):\n    print(json.dumps({'status': 'pass', 'max_error': 0, 'detail': 'x'}))\n"
        "    print('1 passed, 0 failed')\n" + WRONG, "is wrong at"),
    "reads the expected output from the grader's frames": (
        "def stable_softmax(x):\n    frame = sys._getframe(1)\n    while frame:\n"
        "        for value in frame.f_locals.values():\n"
        "            if getattr(value, 'ref', None) is not None:\n                return value.ref[0]\n"
        "        frame = frame.f_back\n" + WRONG, "is wrong at"),
    "replaces the task's reference in the registry": (
        "import course.registry\ncourse.registry.task = lambda *a: (_ for _ in ()).throw(SystemExit(0))\n\n"
        "def stable_softmax(x):\n" + WRONG, "is wrong at"),
    "kills its own process": ("def stable_softmax(x):\n    os.abort()\n", "died (killed by signal 6)"),
    "calls exit": ("def stable_softmax(x):\n    sys.exit(0)\n", "called exit"),
}


def grade(tmp_path, body: str, exercise: str = "w33.stable_softmax", week: str = "w33_softmax") -> dict:
    (tmp_path / f"{week}.py").write_text("import json, os, sys\nimport numpy as np\n\n" + body)
    return isolated.grade_exercise(exercise, isolated.exercise_file(week, folder=str(tmp_path)))


@pytest.mark.parametrize("kind", list(CHEATS))
def test_a_cheating_or_crashing_submission_fails_with_its_cause(tmp_path, kind):
    body, words = CHEATS[kind]
    verdict = grade(tmp_path, body)
    assert verdict["status"] == "FAIL", verdict
    assert words in verdict["detail"], verdict["detail"]
    assert "Traceback" not in verdict["detail"]


def test_a_correct_submission_from_another_folder_passes(tmp_path):
    body = ("def stable_softmax(x):\n    e = np.exp(x - x.max(axis=-1, keepdims=True))\n"
            "    return e / e.sum(axis=-1, keepdims=True)\n")
    assert grade(tmp_path, body)["status"] == "pass"


def test_an_unmasked_store_is_reported_not_a_crash(tmp_path):
    body = textwrap.dedent('''
        import torch, triton, triton.language as tl

        @triton.jit
        def softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
            row = tl.program_id(0)
            cols = tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
            e = tl.exp(x - tl.max(x, axis=0))
            tl.store(y_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty))

        def triton_softmax(x, out=None):
            x2, o2 = x.reshape(-1, x.shape[-1]), out.view(-1, x.shape[-1])
            softmax_kernel[(x2.shape[0],)](x2, o2, x2.shape[1], BLOCK=max(16, triton.next_power_of_2(x2.shape[1])))
            return out
    ''')
    verdict = grade(tmp_path, body, "w33.triton_softmax")  # the address check in the interpreter, on a GPU too
    assert verdict["status"] == "FAIL" and "past the end of `y_ptr`" in verdict["detail"], verdict
    assert "mask the store" in verdict["detail"]


def test_the_cli_grades_a_folder_and_counts_what_did_not_run(tmp_path):
    (tmp_path / "w33_softmax.py").write_text((ROOT / "solutions" / "w33_softmax.py").read_text())
    proc = subprocess.run([sys.executable, "-m", "course", "grade", "w33", "--exercises", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("8 passed, 0 failed" if course.ON_GPU else "6 passed, 0 failed, 2 not run (need a GPU)") in proc.stdout


def test_messages_carry_no_pickles():
    """What the child sends is read as JSON and .npy without pickles: it cannot run code in the parent."""
    import numpy as np
    packed = isolated._pack({"outputs": [np.arange(3.0)], "x": (1, "a"), "n": np.int64(4)})
    assert isolated._unpack(packed) == {"outputs": [pytest.approx([0.0, 1.0, 2.0])], "x": (1, "a"), "n": 4}
    with pytest.raises(ValueError):  # an object array would need a pickle: refused
        isolated._pack({"a": np.array([{}], dtype=object)})
