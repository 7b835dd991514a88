"""Every mutant is rejected by its grader; every reference solution, and every correct variant of one, is accepted."""
import importlib

import pytest

from course import mutants, registry
from course.grading import check

DECLARED = [(week, i, m) for week in registry.WEEKS for i, m in enumerate(mutants.declared(week))]


@pytest.mark.parametrize("week,index,mutant", DECLARED, ids=[m.name for _, _, m in DECLARED])
def test_mutant_is_rejected(week, index, mutant):
    status, detail = mutants.verdict(mutant, index)
    if status == "skipped":
        pytest.skip(f"{mutant.exercise}: {detail} (needs a GPU; see tools/gpu_check.sh)")
    assert status == "rejected", detail


VARIANTS = [(week, i, v) for week in registry.WEEKS for i, v in enumerate(mutants.variants(week))]


@pytest.mark.parametrize("week,index,variant", VARIANTS, ids=[v.name for _, _, v in VARIANTS])
def test_a_correct_solution_written_another_way_is_accepted(week, index, variant):
    status, detail = mutants.accepts(variant, index)
    assert status != "REJECTED", detail


@pytest.mark.parametrize("exercise_id", list(registry.all_tasks()))
def test_reference_solution_is_accepted(exercise_id):
    solutions = importlib.import_module(f"solutions.{registry.week_of(exercise_id)}")
    report = check(exercise_id, getattr(solutions, registry.task(exercise_id).entry))
    assert report.ran or "needs a GPU" in report.note


@pytest.mark.parametrize("exercise_id", list(registry.all_tasks()))
def test_every_exercise_has_three_mutants(exercise_id):
    week = registry.week_of(exercise_id)
    assert sum(m.exercise == exercise_id for m in mutants.declared(week)) >= 3


def test_a_mutant_that_no_longer_applies_fails_loudly():
    bad = mutants.Mutant("w33.stable_softmax", "text not in the solution", "no such text", "x")
    with pytest.raises(ValueError, match="occurs 0 times"):
        mutants.load(bad, 999)
