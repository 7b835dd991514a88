"""Stubs are generated from the solutions and stay in sync with them."""
import pytest

from course import registry, stubs


@pytest.mark.parametrize("name", stubs.solution_names())
def test_stub_file_matches_its_solution(name):
    expected = stubs.make_stub((stubs.ROOT / "solutions" / f"{name}.py").read_text(), name)
    assert stubs.stub_path(name).read_text() == expected, \
        f"course/exercises/{name}.py is out of date: run `python -m course stubs`"


def test_every_week_has_solutions_and_stubs():
    assert set(registry.WEEKS) == set(stubs.solution_names())


@pytest.mark.parametrize("exercise_id", list(registry.all_tasks()))
def test_every_exercise_region_is_a_stub_in_the_exercise_file_and_code_in_the_solution(exercise_id):
    import importlib
    task = registry.task(exercise_id)
    week = registry.week_of(exercise_id)
    stub_text = stubs.stub_path(week).read_text()
    solution = importlib.import_module(f"solutions.{week}")
    for region in task.regions:
        assert not stubs.unfinished(getattr(solution, region)), region
        assert region in stub_text
    assert hasattr(solution, task.entry)


def test_markers_are_replaced_in_python_and_cuda():
    text = '"""doc"""\ndef f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n' \
           'SRC = """\n  // BEGIN SOLUTION\n  int a;\n  // END SOLUTION\n"""\n'
    stub = stubs.make_stub(text, "w99_demo")
    assert "return 1" not in stub and "int a;" not in stub
    assert "    # YOUR CODE HERE\n" in stub and "  // YOUR CODE HERE\n" in stub


def test_the_course_and_its_notebooks_reach_the_solutions_only_through_the_seam():
    """course.kernels is the one way in: a learner's edition without solutions/ must still run."""
    import re
    pattern = re.compile(r"^\s*(from solutions\b|import solutions\b)|import_module\(f?\"solutions\.", re.M)
    places = [p for p in (stubs.ROOT / "course").rglob("*.py") if p.name != "registry.py"]
    places += list((stubs.ROOT / "notebooks").rglob("*.ipynb"))
    offenders = [str(p.relative_to(stubs.ROOT)) for p in places if pattern.search(p.read_text().replace('\\n"', "\n"))]
    assert not offenders, f"import solutions through course.kernels(week) instead: {offenders}"


def test_in_the_learners_edition_an_unsolved_exercise_names_itself():
    import importlib.util
    from course.submission import NotImplementedYet
    # the stub file itself: under COURSE_SOLUTIONS=1 (make test) the import name serves the solution
    spec = importlib.util.spec_from_file_location("_w33_stub_under_test", stubs.stub_path("w33_softmax"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yours = registry._Yours(module, "w33_softmax")
    with pytest.raises(NotImplementedYet, match="solve w33.online_softmax_update first"):
        yours.online_softmax_update(None, None, None)
    assert callable(yours.prepare_rows)  # what is not an exercise passes through


def test_in_the_learners_edition_an_unsolved_exercises_data_is_shown_as_written():
    """A CUDA source string is a region of its exercise, but it runs nothing: a lesson reading it (to show it, or to
    look for an instruction) gets the learner's text, stub marker and all, not a function that raises."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_w38_stub_under_test", stubs.stub_path("w38_flash_attention_impl"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yours = registry._Yours(module, "w38_flash_attention_impl")
    source = yours.TC_FLASH_ATTENTION_SRC
    assert isinstance(source, str) and stubs.MARKER in source
