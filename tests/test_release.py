"""The learner's edition (`make release`, course/release.py), built into a temporary folder: no answers in it, a README
and a Makefile for learners, `import course` works with no solutions/, and its notebooks run by nbval: with the stubs
the only failures are "not implemented yet" (NotImplementedYet) and the knock-ons listed in KNOCK_ONS; with the
reference solutions of that week and every week before it (what a learner there has solved) copied over the exercise
files, no failure but those listed in SOLVED_FAILURES.

`make test` runs week 33's notebooks (about 2 minutes); `make release-check` (COURSE_RELEASE_WEEKS=all) every week;
COURSE_RELEASE_WEEKS=w37_flash_attention_core,w38_flash_attention_impl chosen weeks.
Committing to a branch is tested on a throwaway repository."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course import nbgrade, release, stubs

ROOT = Path(__file__).resolve().parent.parent
ALL_WEEKS = sorted(p.name for p in (ROOT / "notebooks").iterdir() if p.is_dir())
_CHOSEN = os.environ.get("COURSE_RELEASE_WEEKS", "w33_softmax")  # "all", or weeks joined by commas
WEEKS = ALL_WEEKS if _CHOSEN == "all" else [w for w in ALL_WEEKS if w in _CHOSEN.split(",")]

# Notebook cells that fail in the learner's edition with the stubs for a reason other than NotImplementedYet:
# (notebook, nbval's "Cell N", error name): a knock-on (a demo using an unsolved exercise's None, a name a failed
# cell did not define) or a lesson that needs what the edition leaves out. Shrink it as the notebooks are fixed: the
# test fails on a listed cell that no longer fails, so the list stays exact.
KNOCK_ONS: set = set()  # none left
# Cells that fail in the learner's edition even with every exercise solved (the same key).
SOLVED_FAILURES: set = set()  # none left

SHIM = """# The editable install of the instructors' checkout maps `solutions` to it; the learner's edition must not see it.
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
"""


@pytest.fixture(scope="module")
def edition(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("learners") / "course"
    release.build(dest)
    return dest


def learner_env(edition: Path) -> dict:
    """The environment of a learner's checkout: no COURSE_SOLUTIONS, `course` from the edition, no solutions."""
    shim = edition.parent / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(SHIM)
    env = {k: v for k, v in os.environ.items() if k not in ("COURSE_SOLUTIONS", "PYTHONPATH", "COURSE_SHOW")}
    return {**env, "PYTHONPATH": f"{edition}{os.pathsep}{shim}", "MPLBACKEND": "Agg"}


def test_the_edition_holds_no_answers(edition):
    files = [p.relative_to(edition).as_posix() for p in edition.rglob("*") if p.is_file()]
    for gone in ("solutions", "tests", "tools", "notes", ".ci"):
        assert not (edition / gone).exists(), gone
    assert not [f for f in files if f.endswith(".py") and ("mutant" in f or "Mutant(" in (edition / f).read_text())]
    for name in stubs.solution_names():
        text = (edition / "course" / "exercises" / f"{name}.py").read_text()
        assert stubs.MARKER in text and "BEGIN SOLUTION" not in text and "END SOLUTION" not in text, name
        assert "solutions/" not in text.split('"""')[1], f"{name}: the header points at solutions/"
        assert text.split('"""', 2)[2] == stubs.stub_path(name).read_text().split('"""', 2)[2], name


def test_notebooks_have_no_outputs(edition):
    notebooks = sorted(edition.glob("notebooks/*/*.ipynb"))
    assert len(notebooks) == len(list(ROOT.glob("notebooks/*/*.ipynb")))
    for path in notebooks:
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, path


def test_readme_and_makefile_are_for_learners(edition):
    readme = (edition / "README.md").read_text()
    for needed in ("make lab", "make grade", "make grade WEEK=33", "python -m course grade w33.online_softmax",
                   "make grade-notebooks", "YOUR CODE HERE", *(f"notebooks/{w}/" for w in ALL_WEEKS)):
        assert needed in readme, needed
    words = re.findall(r"\b(seeds?|issues?|sessions?|commits?|solutions/|mutants?)\b", readme, re.IGNORECASE)
    assert not words, f"words for maintainers in the learner's README: {words}"
    for target in ("lab", "grade", "grade-notebooks", "doctor", "clean"):
        proc = subprocess.run(["make", "-n", "-C", str(edition), target], capture_output=True, text=True)
        assert proc.returncode == 0, (target, proc.stderr)
    for target in ("test", "solutions", "site", "release", "release-check"):
        proc = subprocess.run(["make", "-n", "-C", str(edition), target], capture_output=True, text=True)
        assert proc.returncode != 0 and "No rule to make target" in proc.stderr, target


def test_import_course_works_without_solutions(edition):
    code = ("import importlib.util, course\nfrom course import registry\n"
            "print(course.__file__, registry.edition(), importlib.util.find_spec('solutions'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=edition, env=learner_env(edition), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(edition / "course" / "__init__.py"), "your", "exercises", "None"], proc.stdout


def _failures(edition: Path, week: str) -> tuple[list[dict], list[dict]]:
    """(every cell's record, the failed ones) of nbval on one week of `edition`."""
    code, output, records = nbgrade.run([edition / "notebooks" / week], cwd=edition, env=learner_env(edition))
    ran = {r["notebook"] for r in records}
    assert ran == {f"notebooks/{week}/{p.name}" for p in (ROOT / "notebooks" / week).glob("*.ipynb")}, output[-3000:]
    return records, [r for r in records if r["outcome"] == "failed"]


def _key(r: dict) -> tuple:
    return r["notebook"], r["cell"], r["ename"]


def _listed(allowlist: set, week: str) -> set:
    return {k for k in allowlist if k[0].startswith(f"notebooks/{week}/")}


@pytest.mark.parametrize("week", WEEKS)
def test_with_the_stubs_only_not_implemented_fails(edition, week):
    records, failed = _failures(edition, week)
    graded = [r for r in records if r["exercises"]]
    assert graded and all(r["ename"] == nbgrade.NOT_IMPLEMENTED for r in graded), \
        [(r["exercises"], r["outcome"], r["ename"]) for r in graded if r["ename"] != nbgrade.NOT_IMPLEMENTED]
    others = {_key(r): r["evalue"].splitlines()[0] if r["evalue"] else "" for r in failed
              if r["ename"] != nbgrade.NOT_IMPLEMENTED}
    unexpected = {k: v for k, v in others.items() if k not in KNOCK_ONS}
    fixed = _listed(KNOCK_ONS, week) - set(others)
    assert not unexpected, f"failures other than NotImplementedYet (fix the notebook, or list in KNOCK_ONS): {unexpected}"
    assert not fixed, f"these no longer fail: remove them from KNOCK_ONS: {sorted(fixed)}"


@pytest.mark.parametrize("week", WEEKS)
def test_with_the_solutions_copied_in_every_cell_passes(edition, week, tmp_path):
    solved = tmp_path / "course"
    shutil.copytree(edition, solved)
    for done in (w for w in ALL_WEEKS if w <= week):  # a learner at this week has solved the weeks before it too
        shutil.copyfile(ROOT / "solutions" / f"{done}.py", solved / "course" / "exercises" / f"{done}.py")
    _, failed = _failures(solved, week)
    found = {_key(r): r["evalue"].splitlines()[0] if r["evalue"] else "" for r in failed}
    unexpected = {k: v for k, v in found.items() if k not in SOLVED_FAILURES}
    assert not unexpected, f"failures with the solutions in place: {unexpected}"
    assert not _listed(SOLVED_FAILURES, week) - set(found), "these pass now: remove them from SOLVED_FAILURES"


# ---------------------------------------------------------------- DEST and BRANCH
def test_a_folder_that_is_not_an_earlier_edition_is_refused_and_an_earlier_one_replaced(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("keep me")
    with pytest.raises(SystemExit, match="not empty"):
        release.build(tmp_path / "mine")
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "keep me"
    first = tmp_path / "edition"
    release.build(first)
    (first / ".git").mkdir()
    (first / "stale.txt").write_text("from an older release")
    release.build(first)
    assert (first / ".git").is_dir() and not (first / "stale.txt").exists() and (first / "Makefile").exists()


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def test_branch_release_commits_without_touching_the_working_tree_or_main(tmp_path, monkeypatch):
    for key, value in {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
                       "GIT_COMMITTER_EMAIL": "t@example.org"}.items():
        monkeypatch.setenv(key, value)
    repo = tmp_path / "repo"
    for rel in release._files(ROOT):  # the working tree as it is, committed in a throwaway repository
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, repo / rel)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "instructors")
    main, index = _git(repo, "rev-parse", "main"), (repo / ".git" / "index").read_bytes()
    (repo / "README.md").write_text("an edit not committed")

    first = release.release_branch("student", repo)
    assert _git(repo, "rev-parse", "student") == first
    files = _git(repo, "ls-tree", "-r", "--name-only", "student").splitlines()
    assert "Makefile" in files and "course/exercises/w33_softmax.py" in files
    assert not [f for f in files if f.split("/")[0] in ("solutions", "tests", "tools", "notes")]
    assert _git(repo, "show", "student:README.md").startswith("# DL Kernels & Attention")
    assert _git(repo, "rev-parse", "HEAD") == main and _git(repo, "symbolic-ref", "HEAD") == "refs/heads/main"
    assert (repo / ".git" / "index").read_bytes() == index
    assert (repo / "README.md").read_text() == "an edit not committed"
    assert _git(repo, "status", "--porcelain") == "M README.md"

    (repo / "course" / "exercises" / "w33_softmax.py").write_text(
        (repo / "course" / "exercises" / "w33_softmax.py").read_text() + "\n# a new line\n")
    _git(repo, "commit", "-q", "-am", "instructors, again")
    second = release.release_branch("student", repo)
    assert _git(repo, "rev-parse", f"{second}^") == first, "the next release is a commit on top of the last"
    assert release.release_branch("student", repo) == second, "nothing new: no empty commit"

    _git(repo, "branch", "feature")
    with pytest.raises(SystemExit, match="not made by `make release`"):
        release.release_branch("feature", repo)
    assert _git(repo, "rev-parse", "feature") == _git(repo, "rev-parse", "main")
