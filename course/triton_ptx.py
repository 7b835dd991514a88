"""What Triton's compiler makes of a course kernel on a Hopper GPU, on any machine: the kernel compiled for sm_90
(no GPU needed) and the instructions that matter counted in its PTX.

Owns: compiling in a separate process (on a machine without a GPU, `import course` switches Triton to its
interpreter, whose kernels cannot be compiled) and the call into Triton's compiler.
"""
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# name shown -> the PTX mnemonic counted
INSTRUCTIONS = {"wgmma (Hopper, a warpgroup's asynchronous MMA)": "wgmma.mma_async",
                "mma.sync (Ampere, one warp's MMA)": "mma.sync",
                "TMA tile copy": "cp.async.bulk.tensor",
                "exp2 on the special-function unit": "ex2.approx"}


# Run in a fresh process: there Triton is imported after the interpreter switch is cleared, so the kernels of the
# solution module and Triton's own library functions (tl.cdiv, ...) are compilable JIT functions.
_COMPILE = """
import importlib.util, json, os, sys
import course.backend  # sets TRITON_INTERPRET on a machine without a GPU; cleared before Triton is imported
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
path, kernel, types, constexprs, warps, stages = json.loads(sys.argv[1])
spec = importlib.util.spec_from_file_location("_ptx_module", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
fn = getattr(module, kernel)
signature = {name: types.get(name, "i32") for name in fn.arg_names}
signature.update({name: "constexpr" for name in constexprs})
source = ASTSource(fn=fn, signature=signature,
                   constexprs={(fn.arg_names.index(name),): value for name, value in constexprs.items()})
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
sys.stdout.write(compiled.asm["ptx"])
"""


@functools.lru_cache(maxsize=64)
def _ptx(args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _COMPILE, args], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode:
        raise RuntimeError((proc.stderr.strip().splitlines() or ["no output"])[-1])
    return proc.stdout


def hopper_ptx(week: str, kernel: str, types: dict, constexprs: dict, num_warps: int = 4, num_stages: int = 3) -> str:
    """PTX of `kernel` from solutions/<week>.py compiled for sm_90. `types` gives the Triton type of pointer and
    float arguments ("*bf16", "*fp32", "fp32"); the others are int32."""
    return _ptx(json.dumps([str(ROOT / "solutions" / f"{week}.py"), kernel, types, constexprs, num_warps, num_stages]))


def instruction_counts(ptx: str) -> dict:
    return {name: ptx.count(mnemonic) for name, mnemonic in INSTRUCTIONS.items()}
