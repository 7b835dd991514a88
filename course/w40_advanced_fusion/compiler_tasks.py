"""Graded task of week 40, day 2: `kernel_facts`, what Triton's compiler made of a kernel, read off its listings.

A case is the TTGIR and the PTX of one course kernel compiled for sm_90 on this machine, by whatever Triton is
installed (course/triton_ptx.hopper_listings: no GPU needed), at a configuration drawn afresh each run: week 37's
FlashAttention forward at several tiles, head dims, warps, masks and dtypes, week 38's forward, and one of week 39's
GELU kernels (one with no tl.dot at all). The reference reads the facts off those two texts, so it is right for any
compiler version; a failure is diagnosed by reading the same texts the way each known slip reads them.
"""
import itertools
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from .. import triton_ptx
from ..grading import Case, GradingError, Task, diagnose, exact

EXACT = 1e-9  # the facts are integers: a slip matches only when it gives the same number
OUTPUTS = ("wgmma", "ex2", "shared_bytes", "warps")


# ---------------------------------------------------------------- the reference
def instructions(ptx: str, mnemonic: str) -> int:
    """The PTX lines whose instruction (after an optional predicate, @%p or @!%p) starts with `mnemonic` followed by
    a modifier or the operands: "wgmma.mma_async" counts the MMAs, not wgmma.fence; labels and comments never match."""
    return len(re.findall(rf"^\s*(?:@!?%\w+\s+)?{re.escape(mnemonic)}(?![\w])", ptx, flags=re.MULTILINE))


def module_attributes(ttgir: str) -> dict:
    """The integer attributes of the TTGIR module ({"ttg.num-warps": 8, "ttg.shared": 24576, ...})."""
    found = re.search(r"^module attributes \{([^}]*)\}", ttgir, flags=re.MULTILINE)
    pairs = re.findall(r'"?([\w.-]+)"?\s*=\s*(\d+)\s*:\s*i\d+', found.group(1) if found else "")
    return {name: int(value) for name, value in pairs}


def kernel_facts(ttgir: str, ptx: str) -> tuple[int, int, int, int]:
    """(wgmma.mma_async instructions, ex2.approx instructions, ttg.shared bytes, ttg.num-warps)."""
    attributes = module_attributes(ttgir)
    return (instructions(ptx, "wgmma.mma_async"), instructions(ptx, "ex2.approx"), attributes["ttg.shared"],
            attributes["ttg.num-warps"])


# ---------------------------------------------------------------- known slips
EVERY_WGMMA_LINE = ("every wgmma line was counted: wgmma.fence, wgmma.commit_group and wgmma.wait_group only order "
                    "the MMAs and wait for them; count the lines whose instruction is wgmma.mma_async")
TTGIR_DOTS = ("the TTGIR's ttng.warp_group_dot ops were counted (one per tl.dot): the PTX has one wgmma.mma_async "
              "per 16-wide step along K (8-wide for tf32) and per 64-row slice a warpgroup owns, so count in the PTX")
EXP2_IN_TTGIR = ("the TTGIR's math.exp2 ops were counted: each works on a whole tile, while the PTX is one thread's "
                 "program, with one ex2.approx per element that thread holds (tl.exp, tl.sigmoid and erf end up as "
                 "ex2.approx too); count in the PTX")
ONE_EX2_FORM = ("some ex2.approx lines were missed: ex2.approx.f32 and ex2.approx.ftz.f32 (denormals flushed to "
                "zero) are both the special-function unit's exp2; count every instruction that starts ex2.approx")
IN_KILOBYTES = "ttg.shared is in bytes: report the number as the TTGIR writes it, not in kilobytes"
SUM_OF_BUFFERS = ("every ttg.local_alloc buffer was added up: buffers that are never live at the same time share "
                  "bytes (see their allocation.offset); ttg.shared, a module attribute, is what a program asks for")
FROM_PTX = ("the PTX declares its shared memory as `.extern .shared .align 16 .b8 global_smem[]`, with no size "
            "(dynamic shared memory, sized at launch): read ttg.shared from the TTGIR's module attributes")
AS_THREADS = "warps, not threads: ttg.num-warps is the count, and each warp is 32 threads (ttg.threads-per-warp)"
THREADS_PER_WARP = "that is ttg.threads-per-warp (32 on every NVIDIA GPU): the warps are ttg.num-warps"
NUM_CTAS = "that is ttg.num-ctas (thread blocks per cluster): the warps are ttg.num-warps"


def _buffer_bytes(ttgir: str) -> int:
    """The bytes of every ttg.local_alloc buffer, added up (shape × element bits / 8)."""
    total = 0
    for dims, bits in re.findall(r"ttg\.local_alloc\b[^\n]*?->\s*!ttg\.memdesc<([\dx]+)x[a-z]+(\d+)", ttgir):
        size = 1
        for extent in dims.split("x"):
            size *= int(extent)
        total += size * int(bits) // 8
    return total


def facts_variants(ttgir: str, ptx: str) -> dict:
    """output -> {hint: [what that slip reads off this case's texts]}."""
    attributes = module_attributes(ttgir)
    shared, warps = attributes["ttg.shared"], attributes["ttg.num-warps"]
    dots = len(re.findall(r"\bttng\.warp_group_dot\b(?!_)", ttgir))
    return {
        "wgmma": {EVERY_WGMMA_LINE: [instructions(ptx, "wgmma")],
                  TTGIR_DOTS: [dots, dots + len(re.findall(r"\bttng\.warp_group_dot_wait\b", ttgir))]},
        "ex2": {EXP2_IN_TTGIR: [len(re.findall(r"\bmath\.exp2\b", ttgir))],
                ONE_EX2_FORM: [instructions(ptx, "ex2.approx.f32"), instructions(ptx, "ex2.approx.ftz.f32")]},
        "shared_bytes": {IN_KILOBYTES: [shared / 1024, shared // 1024], SUM_OF_BUFFERS: [_buffer_bytes(ttgir)],
                         FROM_PTX: [0]},
        "warps": {AS_THREADS: [warps * 32], THREADS_PER_WARP: [attributes.get("ttg.threads-per-warp", 32)],
                  NUM_CTAS: [attributes.get("ttg.num-ctas", 1)]},
    }


def facts_hint(case, got, expected):
    return diagnose(got, expected, facts_variants(**case.kwargs)[case.output], rtol=EXACT)


# ---------------------------------------------------------------- the kernels compiled
class Compile(NamedTuple):
    label: str
    week: str
    kernel: str
    types: dict
    constexprs: dict
    warps: int
    aligned: tuple = ()  # integer arguments a launch finds to be multiples of 16 (the JIT specializes on them)
    stages: int = 3

    def pointers_and_aligned(self) -> list:
        return [name for name, kind in self.types.items() if kind.startswith("*")] + list(self.aligned)


# strides of contiguous tensors and the head dim: multiples of 16 in every launch of the attention kernels
STRIDES37 = ("D", "sqb", "sqh", "sqm", "skb", "skh", "skn", "svb", "svh", "svn")
STRIDES38 = STRIDES37 + ("sob", "soh", "som", "slb", "slh")


def _attention_types(dtype: str, *more: str) -> dict:
    pointers = {name: f"*{dtype}" for name in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")}
    return pointers | {"lse_ptr": "*fp32", "qk_scale": "fp32"} | {name: "*i32" for name in more}


def flash37(block_m, block_n, d, warps, causal, dtype, precision="tf32") -> Compile:
    """Week 37's flash_attention_kernel (solutions/w37_flash_attention_core.py)."""
    mask = "causal" if causal else "not causal"
    inputs = dtype if dtype != "fp32" else f"fp32, {precision} dot"
    return Compile(f"week 37's flash_attention_kernel, {block_m} × {block_n} tiles, d = {d}, {warps} warps, {mask}, "
                   f"{inputs}", "w37_flash_attention_core", "flash_attention_kernel", _attention_types(dtype),
                   dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=d, CAUSAL=causal, STAGES=3, PRECISION=precision),
                   warps, STRIDES37)


def forward38(block_m, block_n, d, warps, causal, dtype, exp2) -> Compile:
    """Week 38's flash_forward_kernel; exp2=False takes exp in the natural base (tl.exp)."""
    base = "exp2" if exp2 else "exp"
    return Compile(f"week 38's flash_forward_kernel, {block_m} × {block_n} tiles, d = {d}, {warps} warps, "
                   f"{'causal' if causal else 'not causal'}, {dtype}, {base}", "w38_flash_attention_impl",
                   "flash_forward_kernel", _attention_types(dtype, "cu_ptr"),
                   dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=d, CAUSAL=causal, VARLEN=False, SEQ_PARALLEL=True,
                        DEFER=True, EXP2=exp2, STAGES=3, PRECISION="tf32"), warps, STRIDES38)


def gelu39(kernel, tanh, dtype) -> Compile:
    """One of week 39's GELU kernels: bias_gelu_kernel (elementwise, no tl.dot) or matmul_bias_gelu_kernel."""
    form = "tanh" if tanh else "erf"
    if kernel == "bias_gelu_kernel":
        types = {"x_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "y_ptr": f"*{dtype}"}
        return Compile(f"week 39's bias_gelu_kernel, 16 × 128 tiles, 4 warps, {form}, {dtype}", "w39_kernel_fusion",
                       kernel, types, dict(TANH=tanh, BLOCK_M=16, BLOCK_N=128), 4, ("n_cols",))
    types = {"a_ptr": f"*{dtype}", "w_ptr": f"*{dtype}", "bias_ptr": f"*{dtype}", "y_ptr": f"*{dtype}"}
    return Compile(f"week 39's matmul_bias_gelu_kernel, 128 × 128 × 64 tiles, 8 warps, {form}, {dtype}",
                   "w39_kernel_fusion", kernel, types,
                   dict(TANH=tanh, PRECISION="tf32", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8), 8,
                   ("N", "K", "stride_am", "stride_wk"))


HALF = ("fp16", "bf16")
FLASH37 = [flash37(m, n, d, w, c, t) for m, n, d, w, c, t in
           itertools.product((64, 128), (64, 128), (64, 128), (4, 8), (False, True), HALF)]


def drawn(rng) -> list[Compile]:
    """Five compiles (each costs seconds): two of week 37's kernel in fp16/bf16, one in fp32 (an ieee dot has no
    tensor-core MMA), week 38's forward, one of week 39's GELU kernels."""
    pick = lambda options: options[int(rng.integers(len(options)))]  # noqa: E731
    chosen = [FLASH37[int(i)] for i in rng.choice(len(FLASH37), 2, replace=False)]
    chosen.append(flash37(64, 64, 64, 4, pick((False, True)), "fp32", pick(("ieee", "tf32"))))
    chosen.append(forward38(*pick(((64, 64, 64, 4), (128, 64, 128, 8), (128, 128, 64, 8))), pick((False, True)),
                            pick(HALF), pick((False, True))))
    chosen.append(gelu39(pick(("bias_gelu_kernel", "matmul_bias_gelu_kernel")), pick((False, True)), pick(HALF)))
    return chosen


def listings(compile_: Compile):
    """(TTGIR, PTX) of one compile, or the compiler's error in words."""
    try:
        return triton_ptx.hopper_listings(compile_.week, compile_.kernel, compile_.types, compile_.constexprs,
                                          num_warps=compile_.warps, num_stages=compile_.stages,
                                          aligned=compile_.pointers_and_aligned())
    except Exception as exc:  # noqa: BLE001 - the compiler's failure, reported in words (facts_cases)
        return f"{type(exc).__name__}: {exc}"


def facts_cases(rng, dtypes):
    """The drawn compiles' listings, compiled side by side; a compile that fails here (in the learner's edition, a
    kernel of an exercise not yet solved) is left out, and a GradingError says why when none is left."""
    chosen = drawn(rng)
    with ThreadPoolExecutor(max(1, min(len(chosen), os.cpu_count() or 1))) as pool:
        texts = list(pool.map(listings, chosen))
    cases = [Case(c.label, (), "float64", kwargs={"ttgir": t[0], "ptx": t[1]})
             for c, t in zip(chosen, texts) if isinstance(t, tuple)]
    if not cases:
        raise GradingError(f"w40.kernel_facts reads the listings of the course's kernels compiled for sm_90, and "
                           f"none compiled here ({chosen[0].label}: {texts[0]}). Without solutions/ the kernels are "
                           f"your own (course/exercises/): solve w37.flash_attention, w38.flash_forward and "
                           f"w39.bias_gelu first.")
    return cases


COMPILER_TASKS = [
    Task("w40.kernel_facts", "numpy", ("kernel_facts",), facts_cases, exact(kernel_facts), outputs=OUTPUTS,
         hint=facts_hint, dtypes=("float64",)),
]
