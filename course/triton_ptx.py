"""What Triton's compiler makes of a course kernel on a Hopper GPU, on any machine: the kernel compiled for sm_90
(no GPU needed) and the instructions that matter counted in its PTX.

Owns: compiling in a separate process (on a machine without a GPU, `import course` switches Triton to its
interpreter, whose kernels cannot be compiled) and the call into Triton's compiler, for the solutions' kernels
(hopper_ptx, shown in the lessons) and for the kernels a graded submission launched (gpu_compile_errors: what a GPU
would reject is rejected on a CPU too).
"""
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# name shown -> the PTX mnemonic counted
INSTRUCTIONS = {"wgmma (Hopper, a warpgroup's asynchronous MMA)": "wgmma.mma_async",
                "mma.sync (Ampere, one warp's MMA)": "mma.sync",
                "TMA tile copy": "cp.async.bulk.tensor",
                "exp2 on the special-function unit": "ex2.approx"}


# Run in a fresh process whose environment (_compiler_env) keeps Triton out of its interpreter, so the kernels of the
# solution module and Triton's own library functions (tl.cdiv, ...) are compilable JIT functions.
_COMPILE = """
import importlib.util, json, os, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
path, kernel, types, constexprs, warps, stages, aligned = json.loads(sys.argv[1])
spec = importlib.util.spec_from_file_location("_ptx_module", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
fn = getattr(module, kernel)
signature = {name: types.get(name, "i32") for name in fn.arg_names}
signature.update({name: "constexpr" for name in constexprs})
source = ASTSource(fn=fn, signature=signature,
                   constexprs={(fn.arg_names.index(name),): value for name, value in constexprs.items()},
                   attrs={(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned
                          if name in fn.arg_names})
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
sys.stdout.write(compiled.asm["ptx"])
"""


def _compiler_env() -> dict:
    """The environment of a process that compiles for a GPU on any machine: no interpreter (course/backend.py)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["COURSE_COMPILE_ONLY"] = "1"
    return env


@functools.lru_cache(maxsize=64)
def _ptx(args: str) -> str:
    proc = subprocess.run([sys.executable, "-c", _COMPILE, args], capture_output=True, text=True,
                          env=_compiler_env(), timeout=300)
    if proc.returncode:
        raise RuntimeError((proc.stderr.strip().splitlines() or ["no output"])[-1])
    return proc.stdout


def compiler_version() -> str:
    """The version of the Triton that compiles here (what hopper_ptx, hopper_sass and hopper_resources report on)."""
    from importlib import metadata
    return metadata.version("triton")


def quoted_for_this_compiler(quoted: dict):
    """The entry of `quoted` (the counts a lesson's text quotes, keyed by Triton version) for the Triton installed
    here, or None, with a note saying so, where the text quotes no counts of this version. Compiled counts
    (instructions, registers, spills) change from one Triton release to the next, so a lesson checks the numbers it
    quotes only against the compiler that produced them."""
    version = compiler_version()
    if version not in quoted:
        print(f"Triton {version} compiled the kernels above; the text quotes the counts of Triton "
              f"{' and '.join(sorted(quoted))}, so yours may differ from its numbers.")
    return quoted.get(version)


def hopper_ptx(week: str, kernel: str, types: dict, constexprs: dict, num_warps: int = 4, num_stages: int = 3,
               aligned=None) -> str:
    """PTX of `kernel` from solutions/<week>.py compiled for sm_90. `types` gives the Triton type of pointer and
    float arguments ("*bf16", "*fp32", "fp32"); the others are int32. `aligned` names the arguments that are multiples
    of 16 (bytes for a pointer, elements for an integer), which a launch tells the compiler about the values it is given
    (so it can use wide loads); by default every pointer, as for tensors PyTorch allocates."""
    if aligned is None:
        aligned = [name for name, kind in types.items() if kind.startswith("*")]
    return _ptx(json.dumps([str(ROOT / "solutions" / f"{week}.py"), kernel, types, constexprs, num_warps, num_stages,
                            sorted(aligned)]))


# Appended to _COMPILE, whose process has just compiled `compiled` and written its PTX: Triton's own shared-memory
# allocation pass (the first thing make_llir does with the TTGIR) run again on a copy of the TTGIR, which adds the
# module attribute ttg.shared (bytes) and each buffer's allocation.offset, and that TTGIR written after a marker line.
_ALLOCATED_TTGIR = """
import tempfile
from triton._C.libtriton import ir, nvidia
from triton.backends.nvidia.compiler import get_ptx_version_from_options
target = GPUTarget("cuda", 90, 32)
backend = triton.compiler.make_backend(target)
context = ir.context()
ir.load_dialects(context)
backend.load_dialects(context)
with tempfile.NamedTemporaryFile("w", suffix=".ttgir") as listing:
    listing.write(compiled.asm["ttgir"])
    listing.flush()
    module = ir.parse_mlir_module(listing.name, context)
module.context = context
passes = ir.pass_manager(context)
options = backend.parse_options({"num_warps": warps, "num_stages": stages})
nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(passes, 90, get_ptx_version_from_options(options, 90))
passes.run(module, "allocate_shared_memory")
if module.get_int_attr("ttg.shared") != compiled.metadata.shared:
    sys.exit(f"the allocation pass run again found {module.get_int_attr('ttg.shared')} bytes of shared memory, "
             f"the compile {compiled.metadata.shared}")
sys.stdout.write("\\n=== ttgir\\n" + str(module))
for stage in ("ttir", "llir"):
    sys.stdout.write(f"\\n=== {stage}\\n" + compiled.asm[stage])
"""


def _kernel_file(week: str) -> Path:
    """solutions/<week>.py, or in the learner's edition (no solutions/) the learner's own course/exercises/<week>.py."""
    solution = ROOT / "solutions" / f"{week}.py"
    return solution if solution.exists() else ROOT / "course" / "exercises" / f"{week}.py"


@functools.lru_cache(maxsize=64)
def _listings(args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _COMPILE + _ALLOCATED_TTGIR, args], capture_output=True, text=True,
                          env=_compiler_env(), timeout=300)
    if proc.returncode:
        raise RuntimeError((proc.stderr.strip().splitlines() or ["no output"])[-1])
    ptx, rest = proc.stdout.split("\n=== ttgir\n")
    ttgir, rest = rest.split("\n=== ttir\n")
    ttir, llir = rest.split("\n=== llir\n")
    return {"ttir": ttir, "ttgir": ttgir, "llir": llir, "ptx": ptx}


def hopper_listings(week: str, kernel: str, types: dict, constexprs: dict, num_warps: int = 4, num_stages: int = 3,
                    aligned=None) -> tuple[str, str]:
    """(TTGIR, PTX) of one compile of `kernel` for sm_90 (arguments as hopper_ptx's), from solutions/<week>.py or,
    in the learner's edition, course/exercises/<week>.py. The TTGIR is Triton's GPU dialect as the compiler hands it
    to LLVM, after its shared-memory allocation: `tt.dot` has become `ttng.warp_group_dot`, and the module attributes
    hold `ttg.num-warps` and `ttg.shared` (the bytes of shared memory a program asks for)."""
    stages = hopper_stages(week, kernel, types, constexprs, num_warps, num_stages, aligned)
    return stages["ttgir"], stages["ptx"]


def hopper_stages(week: str, kernel: str, types: dict, constexprs: dict, num_warps: int = 4, num_stages: int = 3,
                  aligned=None) -> dict:
    """Every listing of one compile for sm_90 (arguments as hopper_ptx's), by stage: "ttir" (Triton's own dialect,
    before any layout), "ttgir" (hopper_listings's), "llir" (LLVM IR) and "ptx"."""
    if aligned is None:
        aligned = [name for name, kind in types.items() if kind.startswith("*")]
    return _listings(json.dumps([str(_kernel_file(week)), kernel, types, constexprs, num_warps, num_stages,
                                 sorted(aligned)]))


_SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)")


def _tools() -> Path:
    """Triton's own CUDA tools: ptxas-blackwell is the assembler it uses for sm_90 (the older ptxas beside it may
    reject the PTX version a newer Triton writes)."""
    import triton
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    if not (tools / "cuobjdump").exists() or not any((tools / n).exists() for n in ("ptxas-blackwell", "ptxas")):
        raise RuntimeError(f"no ptxas and cuobjdump in {tools}")
    return tools


def _assemble(ptx: str, folder: Path) -> tuple[Path, str]:
    """(the cubin, ptxas's verbose report) of `ptx` assembled for sm_90a in `folder`."""
    tools = _tools()
    ptxas = tools / "ptxas-blackwell" if (tools / "ptxas-blackwell").exists() else tools / "ptxas"
    source, cubin = folder / "kernel.ptx", folder / "kernel.cubin"
    source.write_text(ptx)
    flags = ["-lineinfo", "-v", "--regAllocOptLevel=2"]  # as Triton's own build for sm_90 calls it
    done = subprocess.run([str(ptxas), *flags, "--gpu-name=sm_90a", str(source), "-o", str(cubin)], check=True,
                          capture_output=True, text=True, timeout=120)
    return cubin, done.stdout + done.stderr


def hopper_sass(ptx: str) -> list[str]:
    """The opcodes (with their modifiers: "LDG.E.128", "IMAD.HI.U32") of `ptx` assembled for sm_90a, in program
    order, padding NOPs left out: what the GPU executes, one entry per instruction."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin, _ = _assemble(ptx, Path(tmp))
        listing = subprocess.run([str(_tools() / "cuobjdump"), "-sass", str(cubin)], check=True, capture_output=True,
                                 text=True, timeout=120).stdout
    return [op + suffix for op, suffix in _SASS_LINE.findall(listing) if op != "NOP"]


def hopper_resources(ptx: str) -> dict:
    """What ptxas reports for `ptx` on sm_90a: registers per thread, bytes spilled to local memory (stores, loads)
    and the stack frame."""
    with tempfile.TemporaryDirectory() as tmp:
        _, report = _assemble(ptx, Path(tmp))
    number = lambda pattern: int(m.group(1)) if (m := re.search(pattern, report)) else 0  # noqa: E731
    return {"registers": number(r"Used (\d+) registers"), "spill stores": number(r"(\d+) bytes spill stores"),
            "spill loads": number(r"(\d+) bytes spill loads"), "stack frame": number(r"(\d+) bytes stack frame")}


def instruction_counts(ptx: str) -> dict:
    return {name: ptx.count(mnemonic) for name, mnemonic in INSTRUCTIONS.items()}


# Compile each launch the interpreter saw (course/memcheck.Launch) for sm_90; print what the compiler said, per launch.
_CHECK = """
import importlib.util, json, os, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
modules, problems = {}, []
for path, kernel, types, constexprs, warps in json.loads(sys.stdin.read()):
    try:  # a module that cannot be loaded on its own here is not the learner's compile error: skip it
        if path not in modules:
            spec = importlib.util.spec_from_file_location("_gpu_target_" + str(len(modules)), path)
            modules[path] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(modules[path])
        fn = getattr(modules[path], kernel)
    except Exception:
        continue
    try:
        while not isinstance(fn, triton.runtime.JITFunction) and hasattr(fn, "fn"):
            fn = fn.fn
        types = dict(types)
        constexprs = {n: triton.language.dtype(v[9:]) if isinstance(v, str) and v.startswith("tl.dtype:") else v
                      for n, v in constexprs}
        signature = {name: types.get(name, "constexpr" if name in constexprs else "i32") for name in fn.arg_names}
        source = ASTSource(fn=fn, signature=signature,
                           constexprs={(fn.arg_names.index(n),): v for n, v in constexprs.items()})
        triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    except Exception as exc:
        problems.append(str(exc).strip() or type(exc).__name__)
        break
sys.stdout.write(json.dumps(problems))
"""
GPU_COMPILE_TIMEOUT_S = 300


def gpu_compile_errors(launches: list) -> str:
    """What Triton's compiler says when the kernels of these interpreter launches are compiled for sm_90 ("" when
    they compile, or when there is nothing to compile). One launch per kernel and argument types is compiled."""
    unique, seen = [], set()
    for launch in launches:
        key = (launch.path, launch.kernel, launch.types)
        if key not in seen and launch.path.endswith(".py") and launch.constexprs is not None:
            seen.add(key)
            unique.append((launch.path, launch.kernel, launch.types, launch.constexprs, launch.num_warps))
    if not unique:
        return ""
    stamps = tuple(Path(path).stat().st_mtime_ns for path, *_ in unique)
    return _compile_for_gpu(json.dumps(unique), stamps)


@functools.lru_cache(maxsize=256)
def _compile_for_gpu(launches: str, _stamps: tuple) -> str:
    proc = subprocess.run([sys.executable, "-c", _CHECK], input=launches, capture_output=True, text=True,
                          env=_compiler_env(), timeout=GPU_COMPILE_TIMEOUT_S)
    if proc.returncode:
        return ""  # the compiler itself could not start here: nothing to say about the learner's kernel
    problems = json.loads(proc.stdout or "[]")
    return "\n".join(problems[:1])
