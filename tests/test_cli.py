"""The commands of the README, run the way a learner or an instructor runs them."""
import os
import subprocess
import sys

from course import bench
from course.stubs import ROOT
from course.w33_softmax.reference import softmax_cost


def run(*args, solutions=False):
    env = dict(os.environ)
    env.pop("COURSE_SOLUTIONS", None)
    if solutions:
        env["COURSE_SOLUTIONS"] = "1"
    return subprocess.run([sys.executable, "-m", "course", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def test_doctor_reports_and_exits_0():
    proc = run("doctor")
    assert proc.returncode == 0, proc.stderr
    assert "Triton mode" in proc.stdout and "NVRTC" in proc.stdout


def test_grade_stubs_fails_with_not_implemented():
    proc = run("grade", "w33.stable_softmax")
    assert proc.returncode == 1
    assert "not implemented" in proc.stdout and "0 passed, 1 failed" in proc.stdout


def test_grade_solutions_passes():
    proc = run("grade", "w33.stable_softmax", "--solutions")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pass" in proc.stdout and "1 passed, 0 failed" in proc.stdout


def test_unknown_selector_is_a_clear_error():
    proc = run("grade", "w99")
    assert proc.returncode != 0 and "no exercise matches 'w99'" in proc.stderr


def test_bench_without_gpu_shows_recorded_results():
    proc = run("bench", "w33")
    assert proc.returncode == 0, proc.stderr
    assert "recorded" in proc.stdout.lower() and "torch.softmax" in proc.stdout


def test_recorded_results_carry_provenance_and_every_kernel():
    table = bench.recorded("w33_softmax")
    for column in ("device", "date", "torch", "triton", "cupy", "commit", "copy_ceiling_GB/s"):
        assert table[column].notna().all(), column
    assert {"block_softmax", "warp_softmax", "triton_softmax", "online_softmax", "torch.softmax", "copy"} \
        <= set(table.kernel)
    assert set(table.dtype) == {"float32", "bfloat16"}


def test_softmax_cost_by_hand():
    assert softmax_cost(4096, 1024, 4) == {"bytes": 2 * 4096 * 1024 * 4, "flops": 5 * 4096 * 1024}
    assert softmax_cost(1, 1, 2)["bytes"] == 4


def test_a_cuda_exercise_that_only_compiled_is_counted_as_not_run():
    from course.backend import ON_GPU
    proc = run("grade", "w38.tc_flash_attention", "--solutions")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = "1 passed, 0 failed" if ON_GPU else "0 passed, 0 failed, 1 not run (need a GPU)"
    assert expected in proc.stdout, proc.stdout
