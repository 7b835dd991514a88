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
    assert hasattr(solution, exercise_id.split(".")[1])


def test_markers_are_replaced_in_python_and_cuda():
    text = '"""doc"""\ndef f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n' \
           'SRC = """\n  // BEGIN SOLUTION\n  int a;\n  // END SOLUTION\n"""\n'
    stub = stubs.make_stub(text, "w99_demo")
    assert "return 1" not in stub and "int a;" not in stub
    assert "    # YOUR CODE HERE\n" in stub and "  // YOUR CODE HERE\n" in stub
