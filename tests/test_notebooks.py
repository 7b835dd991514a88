"""Notebooks: committed clean, laid out as CONTRIBUTING.md says, and in stub mode every grading cell
fails with the learner-facing "not implemented yet" message. (nbval runs them in solutions mode.)"""
import json
import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").rglob("*.ipynb"))
NOTEBOOKS = [p for p in NOTEBOOKS if ".ipynb_checkpoints" not in p.parts]
DAYS = ["00_overview"] + [f"d{k}_" for k in range(1, 7)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            assert not cell["outputs"] and cell["execution_count"] is None, path


def test_each_week_has_an_overview_and_six_days():
    for week in sorted(p for p in (ROOT / "notebooks").iterdir() if p.is_dir()):
        names = sorted(p.stem for p in week.glob("*.ipynb"))
        assert len(names) == 7 and all(n.startswith(prefix) for n, prefix in zip(names, DAYS)), names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_cell_imports_course_and_prints_the_banner(path):
    first = next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert "import course" in first.source and "course.banner()" in first.source
    assert "%autoreload" in first.source


MAINTAINER_WORDS = re.compile(r"seed\s*`?0\d\d|\b(the|this|an|our) issue\b|issue #\d|\bsessions?\b|previous recording",
                              re.IGNORECASE)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_prose_speaks_to_learners_not_maintainers(path):
    """Sources are named by their titles; no word about how the course was built."""
    for cell in nbformat.read(path, as_version=4).cells:
        text = cell.source if cell.cell_type == "markdown" else "\n".join(
            line for line in cell.source.splitlines() if line.lstrip().startswith("#"))
        found = MAINTAINER_WORDS.search(text)
        assert not found, f"{path.name}: {found.group(0)!r} in {text[max(0, found.start() - 60):found.end() + 60]!r}"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem.startswith("d")], ids=lambda p: p.name)
def test_stub_mode_grading_cells_say_not_implemented(path, monkeypatch):
    monkeypatch.delenv("COURSE_SOLUTIONS", raising=False)
    nb = nbformat.read(path, as_version=4)
    graded = [c for c in nb.cells if "grade" in c.get("metadata", {}).get("tags", [])]
    assert graded, f"{path.name} has no grading cell (tag 'grade')"
    NotebookClient(nb, timeout=300, allow_errors=True, resources={"metadata": {"path": str(path.parent)}},
                   kernel_name="python3").execute(env=dict(os.environ))
    for cell in graded:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert errors, f"grading cell passed in stub mode: {cell.source}"
        assert "not implemented yet" in errors[0].evalue, errors[0].evalue


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_page_title_is_plain_text(path):
    """The first '# ' heading names the page in the site's menu and the browser tab, where TeX stays raw."""
    for cell in nbformat.read(path, as_version=4).cells:
        titles = [line for line in cell.source.splitlines() if line.startswith("# ")]
        if cell.cell_type == "markdown" and titles:
            assert "$" not in titles[0] and "\\" not in titles[0], titles[0]
            return


# what the learner's edition ships of the package (release.py names what it leaves out, so it must say notes/ and tools/)
SHIPPED_SOURCE = sorted(p for p in (ROOT / "course").rglob("*.py") if p.name != "release.py")


@pytest.mark.parametrize("path", SHIPPED_SOURCE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_course_package_speaks_to_learners_too(path):
    """Lessons show the package's code (course.show_source: exercises, references, cost models) and the learner's edition
    ships all of it: no comment names a maintainer's file (notes/ and tools/ are not in that edition) or says how the
    course was built."""
    text = path.read_text()
    for pattern in (MAINTAINER_WORDS, re.compile(r"\bnotes/|\bseed's\b|\btools/", re.IGNORECASE)):
        found = pattern.search(text)
        assert not found, f"{path.name}: {found.group(0)!r} in {text[max(0, found.start() - 60):found.end() + 60]!r}"
