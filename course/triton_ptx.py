"""What Triton's compiler makes of a course kernel on a Hopper GPU, on any machine: the kernel compiled for sm_90
(no GPU needed) and the instructions that matter counted in its PTX.

Owns: loading a solution module with real JIT functions (on a machine without a GPU, `import course` switches
Triton to its interpreter, whose kernels cannot be compiled) and the call into Triton's compiler.
"""
import functools
import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# name shown -> the PTX mnemonic counted
INSTRUCTIONS = {"wgmma (Hopper, a warpgroup's asynchronous MMA)": "wgmma.mma_async",
                "mma.sync (Ampere, one warp's MMA)": "mma.sync",
                "TMA tile copy": "cp.async.bulk.tensor",
                "exp2 on the special-function unit": "ex2.approx"}


@functools.lru_cache(maxsize=None)
def _module(week: str):
    """solutions/<week>.py loaded again with Triton's interpreter off, so its kernels are JIT functions."""
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        spec = importlib.util.spec_from_file_location(f"_ptx_{week}", ROOT / "solutions" / f"{week}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


def hopper_ptx(week: str, kernel: str, types: dict, constexprs: dict, num_warps: int = 4, num_stages: int = 3) -> str:
    """PTX of `kernel` from solutions/<week>.py compiled for sm_90. `types` gives the Triton type of pointer and
    float arguments ("*bf16", "*fp32", "fp32"); the others are int32."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    fn = getattr(_module(week), kernel)
    signature = {name: types.get(name, "i32") for name in fn.arg_names}
    signature.update({name: "constexpr" for name in constexprs})
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(fn.arg_names.index(name),): value for name, value in constexprs.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    return compiled.asm["ptx"]


def instruction_counts(ptx: str) -> dict:
    return {name: ptx.count(mnemonic) for name, mnemonic in INSTRUCTIONS.items()}
