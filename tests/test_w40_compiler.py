"""Week 40, day 2: w40.kernel_facts. The reference reads real listings compiled here for sm_90 (its counts agree
with course.triton_ptx.instruction_counts), is anchored on mnemonics, and the grader accepts the solution and rejects
each mutant with its hint."""
import importlib.util
import math
import re
import secrets
import sys
from pathlib import Path

import pytest

from course import grading, mutants, triton_ptx
from course.w40_advanced_fusion import compiler_tasks as ct

ROOT = Path(__file__).resolve().parent.parent
TASK = ct.COMPILER_TASKS[0]
SEED = secrets.randbelow(2**31)  # one draw for every grade below: its five compiles are cached after the first
LESSON = ct.flash37(128, 64, 64, 8, True, "fp16")
NO_DOT = ct.gelu39("bias_gelu_kernel", True, "bf16")
SOLUTION = (ROOT / "solutions" / "w40_advanced_fusion.py").read_text()


def _load(text: str, tag: str, folder: Path):
    path = folder / f"w40_compiler_{tag}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"w40_compiler_{tag}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.kernel_facts


def _grade(fn):
    return grading.check(TASK.id, fn, seed=SEED)


def _compiled(compile_):
    texts = ct.listings(compile_)
    assert isinstance(texts, tuple), texts
    return texts


# ---------------------------------------------------------------- the reference on real listings
def test_the_reference_agrees_with_instruction_counts():
    for compile_ in (LESSON, NO_DOT):
        ttgir, ptx = _compiled(compile_)
        wgmma, ex2, shared, warps = ct.kernel_facts(ttgir, ptx)
        counts = triton_ptx.instruction_counts(ptx)
        assert wgmma == counts["wgmma (Hopper, a warpgroup's asynchronous MMA)"]
        assert ex2 == counts["exp2 on the special-function unit"] > 0
        assert warps == compile_.warps
        assert ct.module_attributes(ttgir)["ttg.threads-per-warp"] == 32


def test_the_lessons_kernel_holds_wgmma_and_shared_buffers_and_the_elementwise_one_none():
    ttgir, ptx = _compiled(LESSON)
    wgmma, ex2, shared, _ = ct.kernel_facts(ttgir, ptx)
    assert "ttng.warp_group_dot " in ttgir and "math.exp2" in ttgir
    assert wgmma > ttgir.count("ttng.warp_group_dot ") > 0  # each tl.dot became several MMAs
    assert ex2 > ttgir.count("math.exp2")                     # each tile's exp2 became one per element of a thread
    q_tile = 128 * 64 * 2
    assert q_tile < shared < ct._buffer_bytes(ttgir)          # the two loops' K and V buffers share bytes
    ttgir, ptx = _compiled(NO_DOT)
    assert ct.kernel_facts(ttgir, ptx)[0] == 0 and "ttng.warp_group_dot" not in ttgir and "ttg.local_alloc" not in ttgir


def test_an_ieee_dot_in_fp32_has_no_tensor_core_mma():
    ttgir, ptx = _compiled(ct.flash37(64, 64, 64, 4, False, "fp32", "ieee"))
    assert ct.kernel_facts(ttgir, ptx)[0] == 0 and "ttng.warp_group_dot " not in ttgir


# ---------------------------------------------------------------- anchored on mnemonics
PTX = """
\twgmma.fence.sync.aligned;
\t// wgmma.mma_async in a comment
\twgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%r1}, %rd1, %rd2, 0, 1, 1, 0, 0;
\t@%p3 wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%r1}, %rd1, %rd2, %p1, 1, 1, 0, 0;
\twgmma.commit_group.sync.aligned;
\twgmma.wait_group.sync.aligned 0;
$L__BB0_2:                              // %__nv_exp2f.exit
\tex2.approx.ftz.f32 \t%r1, %r2;
\t@!%p2 ex2.approx.f32 \t%r3, %r4;
\tex2.approxnot.f32 \t%r3, %r4;
"""
TTGIR = """#smem = #ttg.shared_memory
module attributes {"ttg.num-ctas" = 1 : i32, "ttg.num-warps" = 8 : i32, ttg.shared = 24576 : i32, \
ttg.target = "cuda:90", "ttg.threads-per-warp" = 32 : i32} {
  %p = math.exp2 %s : tensor<128x64xf32, #mma>
}"""


def test_instructions_are_counted_by_mnemonic():
    assert ct.instructions(PTX, "wgmma.mma_async") == 2
    assert ct.instructions(PTX, "wgmma") == 5
    assert ct.instructions(PTX, "ex2.approx") == 2
    assert ct.kernel_facts(TTGIR, PTX) == (2, 2, 24576, 8)


def test_the_slips_read_the_same_text_their_way():
    slips = ct.facts_variants(TTGIR, PTX)
    assert slips["wgmma"][ct.EVERY_WGMMA_LINE] == [5]
    assert slips["ex2"][ct.EXP2_IN_TTGIR] == [1]
    assert slips["ex2"][ct.ONE_EX2_FORM] == [1, 1]
    assert slips["shared_bytes"][ct.IN_KILOBYTES] == [24.0, 24]
    assert slips["warps"][ct.AS_THREADS] == [256] and slips["warps"][ct.NUM_CTAS] == [1]


# ---------------------------------------------------------------- the grader
def test_the_grader_draws_fresh_compiles():
    import numpy as np
    first, second = (ct.drawn(np.random.default_rng(s)) for s in (1, 2))
    assert len(first) == len(second) == 5 and [c.label for c in first] != [c.label for c in second]


def test_kernels_that_do_not_compile_are_left_out_and_none_is_an_error_in_words(monkeypatch):
    import numpy as np
    real = triton_ptx.hopper_listings

    def only_week_39(week, *args, **kwargs):  # as in the learner's edition with only week 39 solved
        if week != "w39_kernel_fusion":
            raise RuntimeError("NameError: kvh is not defined")
        return real(week, *args, **kwargs)
    monkeypatch.setattr(triton_ptx, "hopper_listings", only_week_39)
    assert [c.name[:9] for c in ct.facts_cases(np.random.default_rng(SEED), ())] == ["week 39's"]
    monkeypatch.setattr(triton_ptx, "hopper_listings", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stub")))
    with pytest.raises(grading.GradingError, match="none compiled here.*solve w37.flash_attention"):
        ct.facts_cases(np.random.default_rng(SEED), ())


def test_the_grader_accepts_the_solution(tmp_path):
    report = _grade(_load(SOLUTION, "solution", tmp_path))
    assert report.ran and report.cases == 5, f"seed {SEED}: {report}"


def test_the_grader_names_the_summed_buffers(tmp_path):
    solution = _load(SOLUTION, "solution", tmp_path)

    def summed(ttgir, ptx):  # every buffer's shape × element size (the course's own functions are refused here)
        wgmma, ex2, _, warps = solution(ttgir, ptx)
        buffers = re.findall(r"ttg\.local_alloc\b[^\n]*?-> !ttg\.memdesc<([\dx]+)x[a-z]+(\d+)", ttgir)
        return wgmma, ex2, sum(math.prod(map(int, dims.split("x"))) * int(bits) // 8 for dims, bits in buffers), warps
    with pytest.raises(grading.GradingError, match="every ttg.local_alloc buffer was added up"):
        _grade(summed)


COMPILER_MUTANTS = [m for m in mutants.declared("w40_advanced_fusion") if m.exercise == TASK.id]


@pytest.mark.parametrize("index", range(len(COMPILER_MUTANTS)), ids=[m.bug for m in COMPILER_MUTANTS])
def test_the_grader_rejects_each_mutant_with_its_hint(index):
    mutant = COMPILER_MUTANTS[index]
    with pytest.raises(grading.GradingError) as rejected:
        _grade(mutants.load(mutant, index))  # fails loudly unless `old` occurs once in the solution
    assert mutant.hint in str(rejected.value), f"seed {SEED}: {rejected.value}"
