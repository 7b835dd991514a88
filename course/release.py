"""The learner's edition (`make release`): this repository without the answers, for learners to clone.

Owns: what the edition leaves out (LEFT_OUT), what it rewrites (notebooks without outputs, the exercise files'
header, a README and a Makefile for learners: the main Makefile's learner targets, copied), and committing it to a
branch of this repository without touching the working tree, the index or any other branch.
`python -m course release DEST` writes a folder; `--branch student` adds a commit on that branch (built from HEAD).
"""
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import nbformat

from . import site, stubs

ROOT = Path(__file__).resolve().parent.parent
# path (a folder or a file, relative to the repository) -> why the learner does not get it
LEFT_OUT = {
    "solutions": "the reference solutions",
    "tests": "the course's own tests, and tests/mutants/ (wrong solutions the graders must reject)",
    "course/mutants.py": "running the mutants",
    "tools": "instructors' experiments and GPU scripts",
    "notes": "instructors' findings",
    "book": "the site's configuration (the site is built from the instructors' edition)",
    ".ci": "the course's CI",
    "CONTRIBUTING.md": "how the course is built",
}
# the main Makefile's targets that make sense without solutions/ (with the rule that creates the environment)
MAKE_TARGETS = ("env", "$(STAMP)", "lab", "grade", "grade-notebooks", "doctor", "bench", "clean")
TRAILER = "Learner's-edition-of:"  # in the message of every commit `--branch` makes; how a release branch is known

README = """\
# DL Kernels & Attention

Softmax, normalisation and attention kernels, from the math to NumPy to CUDA C (CuPy RawKernel) to
Triton, graded and measured against the libraries you would otherwise use.

```bash
make lab       # create .venv if needed, install, open JupyterLab on notebooks/
make grade     # grade every exercise you have written
```

Needs Linux and Python ≥ 3.11. No GPU needed to work through the course.

## The weeks

Start with a week's `00_overview.ipynb`, then its days `d1_…` to `d6_…` in order.

| week | notebooks |
| --- | --- |
{weeks}

## Your exercises

Each day ends in graded exercises. The code you write lives in `course/exercises/wNN_<topic>.py`: replace each
`YOUR CODE HERE` line with your code. The notebooks reload that file automatically. A lesson that runs one of your
kernels before you have written it stops with a one-line `NotImplementedYet` naming the exercise to solve first;
solve it and run the cell again.

## Grading

A grading cell in a notebook calls `course.check("w33.stable_softmax", ex.stable_softmax)`: it runs your function on
fresh random inputs (rows of length 1, odd lengths, huge logits, `-inf` entries, ...), compares with a float64
reference within a tolerance printed with its reason, and when something is wrong says which case failed, where, and
a hint. From a terminal:

```bash
make grade                # every exercise, each in a fresh process that never sees the answers
make grade WEEK=33        # one week
.venv/bin/python -m course grade w33.online_softmax   # one exercise
make grade-notebooks      # run your notebooks top to bottom; a table of every grading cell's result
make grade-notebooks WEEK=33
```

There is no `make test` in this edition: `make grade` and `make grade-notebooks` are your checks.
Without a GPU, CUDA C exercises are compiled but not run: they are counted apart ("not run (need a GPU)"),
never as passed.

## CPU or GPU

`make doctor` (or `.venv/bin/python -m course doctor`) says what your machine can run.
- Without a GPU: NumPy runs as usual; Triton kernels run in Triton's interpreter on CPU tensors
  (float32 and float16 only: bfloat16 arithmetic is wrong there, and timings mean nothing); CUDA C
  kernels are compiled with NVRTC, so you see compile errors with line numbers and the register and
  shared-memory report, but they are not run. GPU timings come from recorded results, shown with
  device, date and versions.
- With an NVIDIA GPU: everything runs and is measured live (`make bench` measures your kernels against
  the libraries you would otherwise use).

`make clean` removes caches. `conda env create -f environment.yml` installs the same packages as `make lab`.
"""

EXERCISES_HEADER = ('"""Your exercises for week {week_number}.\n\n'
                    "Replace every `{marker}` line with your code, then run the grading cell in the notebook\n"
                    "(or `python -m course grade {week}.<exercise>`).\n\"\"\"")


def _files(root: Path) -> list[str]:
    """The repository's files, relative to `root`: git's tracked and not-ignored ones, or every file outside caches."""
    if (root / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                             check=True, capture_output=True).stdout.decode()
        return sorted({f for f in out.split("\0") if f and (root / f).is_file()})
    skip = {".git", ".venv", "_build", "__pycache__", ".pytest_cache", ".ipynb_checkpoints"}
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and not skip & set(p.relative_to(root).parts) and not p.name.endswith(".pyc"))


def left_out(path: str) -> bool:
    return any(path == x or path.startswith(x + "/") for x in LEFT_OUT) or "egg-info" in path


def makefile(main_makefile: str) -> str:
    """The learner's Makefile: the main Makefile's first paragraph (variables) and its learner targets, verbatim."""
    paragraphs = main_makefile.strip("\n").split("\n\n")
    kept = [paragraphs[0]]
    for p in paragraphs[1:]:
        rule = next((line for line in p.splitlines() if re.match(r"^[^\s#][^=]*:(?!=)", line)), None)
        if rule and rule.split(":")[0].strip() in MAKE_TARGETS:
            kept.append(p)
    missing = set(MAKE_TARGETS) - {next(ln for ln in p.splitlines() if re.match(r"^[^\s#][^=]*:(?!=)", ln)
                                        ).split(":")[0].strip() for p in kept[1:]}
    if missing:
        raise ValueError(f"the Makefile has no target {', '.join(sorted(missing))} for the learner's edition")
    phony = ".PHONY: " + " ".join(t for t in MAKE_TARGETS if not t.startswith("$"))
    head = ("# The learner's edition of the course (made by `make release` from the instructors' edition).\n"
            + re.sub(r"^\.PHONY:.*\n?", "", kept[0], flags=re.MULTILINE).rstrip("\n"))
    return "\n\n".join([head, phony, *kept[1:]]) + "\n"


def readme(root: Path) -> str:
    weeks = []
    for title, files in site.parts(root / "notebooks"):
        weeks.append(f"| {title} | `{Path(files[0]).parent.as_posix()}/` |")
    return README.format(weeks="\n".join(weeks))


def exercises_file(text: str, name: str) -> str:
    """The exercise file with a header that does not point at solutions/ (the edition has none)."""
    week = name.split("_")[0]
    old = stubs.HEADER.format(name=name, marker=stubs.MARKER, week=week)
    new = EXERCISES_HEADER.format(week_number=week[1:], marker=stubs.MARKER, week=week)
    return new + text[len(old):] if text.startswith(old) else text


def clean_notebook(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)
    return nbformat.writes(nb) + "\n"


def _is_release(dest: Path) -> bool:
    return (dest / "course" / "exercises").is_dir() and not (dest / "solutions").exists()


def build(dest: Path, source: Path = ROOT) -> list[str]:
    """Write the learner's edition of `source` into `dest` (empty, absent, or an earlier release: replaced, its .git
    kept). Returns the files written, relative to `dest`."""
    dest, source = Path(dest).resolve(), Path(source).resolve()
    if dest == source or source in dest.parents:
        raise SystemExit(f"release: {dest} is inside the repository; choose a folder outside it")
    if dest.exists() and any(dest.iterdir()):
        if not _is_release(dest):
            raise SystemExit(f"release: {dest} is not empty and is not an earlier learner's edition; "
                             "choose an empty or new folder")
        for child in dest.iterdir():
            if child.name != ".git":
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for rel in _files(source):
        if left_out(rel):
            continue
        src, out = source / rel, dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".ipynb"):
            out.write_text(clean_notebook(src))
        elif rel == "README.md":
            out.write_text(readme(source))
        elif rel == "Makefile":
            out.write_text(makefile(src.read_text()))
        elif re.fullmatch(r"course/exercises/w\d\d_\w+\.py", rel):
            out.write_text(exercises_file(src.read_text(), Path(rel).stem))
        else:
            shutil.copyfile(src, out)
        shutil.copymode(src, out)
        written.append(rel)
    return written


# ---------------------------------------------------------------- the branch
def _git(repo: Path, *args: str, env: dict | None = None, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                          env=None if env is None else {**os.environ, **env})
    if check and proc.returncode:
        raise SystemExit(f"release: git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def commit_to_branch(tree_dir: Path, repo: Path, branch: str, source_commit: str) -> str:
    """Commit the files of `tree_dir` as the next commit of `branch` in `repo` (a new branch, or one made by an earlier
    release) with git's plumbing: a private index, no checkout; the working tree, the index and HEAD stay as they were.
    Returns the new commit's hash."""
    ref = f"refs/heads/{branch}"
    parent = _git(repo, "rev-parse", "--verify", "--quiet", ref, check=False)
    if parent and TRAILER not in _git(repo, "log", "-1", "--format=%B", parent):
        raise SystemExit(f"release: branch {branch!r} exists and was not made by `make release` (its last commit "
                         f"has no '{TRAILER}' line); choose another name with BRANCH=...")
    git_dir = Path(_git(repo, "rev-parse", "--absolute-git-dir"))
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_WORK_TREE": str(tree_dir), "GIT_DIR": str(git_dir)}
        _git(tree_dir, "add", "--all", "--force", ".", env=env)
        tree = _git(tree_dir, "write-tree", env=env)
    if parent and _git(repo, "rev-parse", f"{parent}^{{tree}}") == tree:
        print(f"release: {branch} already holds this edition ({parent[:12]}); nothing to add")
        return parent
    message = (f"Learner's edition of {source_commit[:12]}\n\nMade by `make release BRANCH={branch}`: no solutions/, "
               f"no tests/ or mutants, no tools/ or notes/, notebooks without outputs.\n\n{TRAILER} {source_commit}\n")
    commit = _git(repo, "commit-tree", tree, *(["-p", parent] if parent else []), "-m", message)
    _git(repo, "update-ref", "-m", "make release", ref, commit, parent or "0" * 40)
    return commit


def release_branch(branch: str, repo: Path = ROOT) -> str:
    """Build the learner's edition of HEAD (committed files only) and add it as a commit on `branch`."""
    head = _git(repo, "rev-parse", "HEAD")
    if _git(repo, "status", "--porcelain", "--untracked-files=no"):
        print(f"release: the working tree has changes that are not in HEAD; the edition is built from HEAD "
              f"({head[:12]}) only")
    with tempfile.TemporaryDirectory() as tmp:
        source, edition = Path(tmp) / "source", Path(tmp) / "edition"
        source.mkdir()
        archive = subprocess.run(["git", "archive", "--format=tar", head], cwd=repo, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
        build(edition, source)
        return commit_to_branch(edition, repo, branch, head)


def main(dest: str | None, branch: str | None) -> int:
    if not dest and not branch:
        raise SystemExit("release: say where: `make release DEST=folder` or `make release BRANCH=student`")
    if dest:
        files = build(Path(dest))
        print(f"wrote the learner's edition to {dest} ({len(files)} files; left out: "
              f"{', '.join(LEFT_OUT)}; notebooks without outputs)")
    if branch:
        commit = release_branch(branch)
        print(f"branch {branch} is at {commit[:12]}: the learner's edition of HEAD "
              f"(`git push <remote> {branch}` publishes it)")
    return 0
