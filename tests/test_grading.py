"""The grader's guarantees, each shown by a wrong or misbehaving function it must catch."""
import importlib.util

import numpy as np
import pytest
import torch

import course
from course import grading, registry
from course.stubs import ROOT


def load_copy(path: str, name: str):
    """The module at `path` loaded under a name of its own: the grader refuses calls into the course's solutions
    (`solutions.*`), but a learner's copy of a solution is their code."""
    spec = importlib.util.spec_from_file_location(name, ROOT / path)  # ROOT / an absolute path is that path
    module = importlib.util.module_from_spec(spec)
    import sys
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_stubs(week: str = "w33_softmax"):
    return load_copy(f"course/exercises/{week}.py", f"{week}_stub_under_test")


def learner_copy(week: str):
    return load_copy(f"solutions/{week}.py", f"{week}_learner_copy")


sol = learner_copy("w33_softmax")


def test_solution_passes_and_report_names_cases_and_tolerance():
    report = course.check("w33.stable_softmax", sol.stable_softmax)
    assert report.ran and report.cases >= 10
    text = repr(report)
    assert "cases passed" in text and "tolerance float32" in text and "mantissa" in text


@pytest.mark.parametrize("exercise_id", list(registry.all_tasks()))
def test_every_stub_says_not_implemented_yet(exercise_id):
    stubs = load_stubs(registry.week_of(exercise_id))
    with pytest.raises(grading.NotImplementedYet, match="not implemented yet"):
        course.check(exercise_id, getattr(stubs, exercise_id.split(".")[1]))


def test_grading_error_is_an_assertion_error_without_grader_traceback():
    with pytest.raises(AssertionError) as info:
        course.check("w33.stable_softmax", lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True))
    err = info.value
    assert isinstance(err, grading.GradingError)
    assert err.__cause__ is None and err.__suppress_context__
    rendered = "\n".join(err._render_traceback_())
    assert "Traceback" not in rendered and "grading.py" not in rendered
    assert "hint:" in str(err) and "reproduce with" in str(err)


def test_failure_points_at_the_case_and_first_bad_element():
    def unnormalised(x):
        return np.exp(x - x.max(-1, keepdims=True))
    with pytest.raises(grading.GradingError) as info:
        course.check("w33.stable_softmax", unnormalised, seed=3)
    msg = str(info.value)
    assert 'case "' in msg and "first wrong element" in msg and "constant factor" in msg


def test_library_softmax_is_refused():
    import torch

    def cheat(x):
        return torch.softmax(torch.from_numpy(x), -1).numpy()
    with pytest.raises(grading.GradingError, match="not allowed"):
        course.check("w33.stable_softmax", cheat)
    assert torch.softmax(torch.zeros(2), 0)[0] == 0.5  # restored afterwards


def test_modified_input_is_caught():
    def in_place(x):
        x -= x.max(-1, keepdims=True)
        np.exp(x, out=x)
        x /= x.sum(-1, keepdims=True)
        return x
    with pytest.raises(grading.GradingError, match="was modified"):
        course.check("w33.stable_softmax", in_place)


def test_unwritten_output_is_caught_by_the_poison():
    def skips_last_row(x, out=None):
        full = sol.triton_softmax(x)
        out[:-1] = full[:-1]
        return out
    with pytest.raises(grading.GradingError, match="never written"):
        course.check("w33.triton_softmax", skips_last_row)


def test_a_learner_exception_is_reported_with_its_message():
    def broken(x):
        raise ValueError("my own bug")
    with pytest.raises(grading.GradingError, match="ValueError: my own bug"):
        course.check("w33.stable_softmax", broken)


def test_hung_code_times_out(monkeypatch):
    monkeypatch.setattr(grading.submission, "TIMEOUT_S", 1)

    def hangs(x):
        while True:
            pass
    with pytest.raises(grading.GradingError, match="more than 1 s"):
        course.check("w33.stable_softmax", hangs)


def test_state_tasks_check_the_empty_state():
    def no_guard(m_a, l_a, m_b, l_b):
        m = np.maximum(m_a, m_b)
        return m, l_a * np.exp(m_a - m) + l_b * np.exp(m_b - m)
    with pytest.raises(grading.GradingError, match="NaN"):
        course.check("w33.merge_softmax_states", no_guard)


def test_inputs_are_fresh_each_run_and_reproducible_by_seed():
    task = registry.task("w33.stable_softmax")
    a = task.cases(np.random.default_rng(1), ("float32",))
    b = task.cases(np.random.default_rng(1), ("float32",))
    c = task.cases(np.random.default_rng(2), ("float32",))
    assert all(np.array_equal(x.inputs[0], y.inputs[0]) for x, y in zip(a, b))
    assert not np.array_equal(a[2].inputs[0], c[2].inputs[0])


def test_every_tolerance_has_a_reason():
    for dtype, (atol, rtol, why) in grading.TOLERANCES.items():
        assert atol > 0 and 0 < rtol < 0.1 and len(why) > 20, dtype


def test_unknown_exercise_lists_the_known_ones():
    with pytest.raises(KeyError, match="w33.stable_softmax"):
        course.check("w33.nope", sol.stable_softmax)


def test_sums_are_judged_against_the_size_of_their_terms():
    """Weight gradients are sums with cancellation: the solution passes (judged against |dy·xhat| summed),
    a real bug still fails, and the scale is the sum of the terms' sizes."""
    from course.w34_layernorm import reference as ref
    w34 = learner_copy("w34_layernorm")
    assert course.check("w34.norm_weight_grad", w34.norm_weight_grad).ran

    def doubled_bias_grad(x, weight, dy):
        dweight, dbias = w34.norm_weight_grad(x, weight, dy)
        return dweight, 2 * dbias
    with pytest.raises(grading.GradingError, match="dbias"):
        course.check("w34.norm_weight_grad", doubled_bias_grad)
    assert ref.norm_backward_scale(np.ones((2, 3)), np.ones(3), np.ones((2, 3)))[2].tolist() == [2.0, 2.0, 2.0]


def test_a_launcher_must_return_the_out_it_was_given():
    w34 = learner_copy("w34_layernorm")

    def fresh_output(x, weight, out=None):
        return w34.rmsnorm(x, weight)  # ignores `out`
    with pytest.raises(grading.GradingError, match="first output must be the `out` tensor"):
        course.check("w34.rmsnorm", fresh_output)


def test_the_numbers_shown_differ_and_integers_are_exact():
    close = lambda x: sol.stable_softmax(x) * (1 + 3e-8)  # noqa: E731 - wrong in the 8th digit, float64 notices
    with pytest.raises(grading.GradingError) as info:
        course.check("w33.stable_softmax", close)
    shown = info.value.args[0].split("got ")[1].split("\n")[0]
    got, expected = shown.split(", expected ")
    assert got != expected
    assert grading._pair(4096.0, 4097.0) == "4096, expected 4097"


def test_outputs_that_are_not_numbers_get_a_message():
    with pytest.raises(grading.GradingError, match="must be numbers"):
        course.check("w33.stable_softmax", lambda x: "softmax")


def test_a_list_of_outputs_is_taken_as_the_outputs():
    s37 = learner_copy("w37_flash_attention_core")
    report = course.check("w37.causal_tile_bounds", lambda **kw: list(s37.causal_tile_bounds(**kw)))
    assert report.ran


def test_exit_and_interrupt_in_learner_code_are_reported_not_raised():
    def leaves(x):
        raise SystemExit(3)

    def interrupted(x):
        raise KeyboardInterrupt
    with pytest.raises(grading.GradingError, match="called exit"):
        course.check("w33.stable_softmax", leaves)
    with pytest.raises(grading.GradingError, match="interrupted"):
        course.check("w33.stable_softmax", interrupted)


def test_an_output_the_launcher_allocates_and_never_writes_is_caught():
    import torch
    s37 = learner_copy("w37_flash_attention_core")

    def forgets_lse(q, k, v, causal=False):
        o, _ = s37.flash_attention(q, k, v, causal=causal)
        return o, torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)  # never written
    with pytest.raises(grading.GradingError, match="never written"):
        course.check("w37.flash_attention", forgets_lse)


@pytest.mark.parametrize("cheat", ["alias", "aten", "method"])
def test_a_banned_operator_is_caught_at_the_dispatcher_whatever_its_name(cheat):
    import torch
    alias = torch.nn.functional.softmax  # bound before grading, so renaming the library function misses it
    run = {"alias": lambda x: alias(x, dim=-1), "aten": lambda x: torch.ops.aten._softmax(x, -1, False),
           "method": lambda x: torch.Tensor.softmax(x, -1)}[cheat]
    with pytest.raises(grading.GradingError, match="aten._softmax|write it yourself"):
        course.check("w33.triton_softmax", lambda x, out=None: out.copy_(run(x)) if out is not None else run(x))


@pytest.mark.parametrize("exercise,cheat", [
    ("w39.bias_gelu", lambda x, b: torch.ops.aten.gelu(x + b)),
    ("w39.bias_gelu", lambda x, b: torch.Tensor.tanh(x + b)),
    ("w39.bias_gelu", lambda x, b: torch.ops.aten.silu(x + b))])
def test_an_activation_is_caught_at_the_dispatcher_whatever_its_name(exercise, cheat):
    def bias_gelu(x, bias, approximate="none", out=None):
        return out.copy_(cheat(x, bias))
    with pytest.raises(grading.GradingError, match="write it yourself"):
        course.check(exercise, bias_gelu)


def test_dropout_is_caught_at_the_dispatcher_whatever_its_name():
    def dropout_residual(x, residual, dy, p, seed, offset=0, out=None):
        out.copy_(torch.ops.aten.native_dropout(x, p, True)[0] + residual)
        return out, dy
    with pytest.raises(grading.GradingError, match="write it yourself"):
        course.check("w39.dropout_residual", dropout_residual)


def test_a_reference_of_the_course_is_refused_whatever_name_it_has():
    from course.w33_softmax.reference import softmax as my_softmax  # an alias bound before grading

    with pytest.raises(grading.GradingError, match="course's own answers"):
        course.check("w33.stable_softmax", lambda x: my_softmax(x))
    assert np.allclose(my_softmax(np.zeros((1, 2))), 0.5)  # and it works again afterwards


def test_an_exercise_file_that_imports_a_reference_is_refused(tmp_path):
    (tmp_path / "w33_softmax.py").write_text("from course.w33_softmax.reference import softmax as stable_softmax\n"
                                             "from solutions.w33_softmax import triton_softmax\n")
    module = load_copy(tmp_path / "w33_softmax.py", "course.exercises.w33_softmax_someone")
    with pytest.raises(grading.GradingError, match="imports `course.w33_softmax.reference`"):
        course.check("w33.stable_softmax", module.stable_softmax)
    with pytest.raises(grading.GradingError, match="imports .*`solutions.w33_softmax`"):
        course.check("w33.triton_softmax", module.triton_softmax)


TRITON_BUGS = '''
import triton, triton.language as tl
SCALE = 1.0

@triton.jit
def reads_a_global(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32) * SCALE
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=cols < n_cols)

@triton.jit
def unmasked_load(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.where(cols < n_cols, tl.load(x_ptr + row * n_cols + cols).to(tl.float32), -float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=cols < n_cols)

def launcher(kernel, name):
    def triton_softmax(x, out=None):
        x2, o2 = x.reshape(-1, x.shape[-1]), out.view(-1, x.shape[-1])
        kernel[(x2.shape[0],)](x2, o2, x2.shape[1], BLOCK=max(16, triton.next_power_of_2(x2.shape[1])))
        return out
    triton_softmax.__name__ = name  # module-level, so that a GPU machine can also grade it in the interpreter
    return triton_softmax

softmax_reading_a_global = launcher(reads_a_global, "softmax_reading_a_global")
softmax_with_unmasked_load = launcher(unmasked_load, "softmax_with_unmasked_load")
'''


@pytest.fixture(scope="module")
def triton_bugs(tmp_path_factory):
    path = tmp_path_factory.mktemp("bugs") / "triton_bugs.py"
    path.write_text(TRITON_BUGS)
    return load_copy(path, "triton_bugs_under_test")


def test_an_unmasked_load_is_caught_in_the_interpreter(triton_bugs):
    """Its stray values are masked away, so only the address check sees it: on a GPU too (a CPU child's pass)."""
    with pytest.raises(grading.GradingError, match="loaded .* past the end of `x_ptr`.*mask the load"):
        course.check("w33.triton_softmax", triton_bugs.softmax_with_unmasked_load)


def test_a_kernel_the_gpu_compiler_rejects_is_rejected_on_cpu(triton_bugs):
    where = "" if course.backend.ON_GPU else "does not compile for a GPU(.|\n)*"
    with pytest.raises(grading.GradingError, match=where + "global variable SCALE"):
        course.check("w33.triton_softmax", triton_bugs.softmax_reading_a_global)


def test_a_write_past_the_end_of_out_lands_in_the_guard_band():
    import torch

    def spills(x, out=None):
        out.copy_(sol.triton_softmax(x))
        torch.as_strided(out, (out.numel() + 5,), (1,))[out.numel():] = 0.0  # five elements past the end
        return out
    with pytest.raises(grading.GradingError, match="wrote 5 elements past the end of `out`: mask the store"):
        course.check("w33.triton_softmax", spills)


def test_the_hint_is_the_one_most_failing_cases_agree_on():
    def failure(hint):
        return grading.Mismatch([], [], hint, "fallback", None)
    assert grading._diagnosis([failure(None), failure("b"), failure("a"), failure("a")]) == "a"
    assert grading._diagnosis([failure("a"), failure("b")]) == "a" + grading.OR + "b"  # a tie: both, in order
    assert grading._diagnosis([failure("a"), failure("3 elements were never written")]).endswith("never written")
    assert grading._diagnosis([failure(None)]) == "fallback"
    both = "a" + grading.OR + "b"
    assert grading._diagnosis([failure(both)]) == both  # one case, two bugs it cannot tell apart: both named
    assert grading._diagnosis([failure(both), failure("b")]) == "b"  # another case decides


def test_diagnosis_names_one_bug_only_where_the_case_can_tell():
    expected = np.array([0.25, 0.75])
    doubled, halved = expected * 2, expected / 2
    assert grading.diagnose(doubled * 1.001, expected, {"doubled": doubled, "halved": halved}) == "doubled"
    assert grading.diagnose(doubled, expected, {"doubled": doubled, "also doubled": [halved, doubled]}) == \
        "doubled" + grading.OR + "also doubled"  # this case cannot tell them apart
    assert grading.diagnose(expected * 1.001, expected, {"a no-op here": expected}) is None  # cannot show
    nan = np.full(2, np.nan)
    assert grading.diagnose(nan, expected, {"0/0": nan, "doubled": doubled}) == "0/0"
    assert grading.diagnose(np.array([1.0, 9.0]), expected, {"doubled": doubled}) is None


def test_a_crash_inside_tritons_compiler_is_named_as_such_not_as_the_learners_bug():
    from course.submission import _learner_error
    said = _learner_error(RuntimeError("PassManager::run failed"))
    assert "internal error of Triton" in said and "written another way" in said
    assert _learner_error(ValueError("shapes differ")) == "your code raised ValueError: shapes differ"


def test_a_case_that_cannot_tell_two_bugs_apart_still_names_them():
    # With this seed every failing case of the mutant gives the same m as a second known bug (the smaller of the
    # maxima): each such case votes for both, so the hint names both rather than nothing.
    from course.submission import GradingError
    from course.w33_softmax.tasks import STATE_MAX, STATE_MIN

    def online_softmax_update(m, l, chunk):
        m_new = chunk.max(axis=-1)  # the running max ignored
        shift = np.where(np.isneginf(m_new), 0.0, m_new)
        return m_new, l * np.exp(m - shift) + np.exp(chunk - shift[:, None]).sum(axis=-1)

    with pytest.raises(GradingError) as failed:
        course.check("w33.online_softmax_update", online_softmax_update, seed=1011358401)
    assert STATE_MAX in str(failed.value) and STATE_MIN in str(failed.value)
