"""What a GPU would catch, caught in Triton's CPU interpreter while a submission is graded.

Owns two things, both active only inside `watching()` on a machine without a GPU:
- Memory: every address a kernel loads from or stores to (where its mask is true) must lie inside a tensor of its
  launch. Lanes outside are dropped, not performed (an unmasked store would otherwise overwrite the interpreter's
  own memory and kill the process), counted, and reported when the launch ends, naming the pointer they ran past.
- Launches: each kernel launched is recorded (source file, name, argument types, constexprs, num_warps), so that
  course/triton_ptx.py can compile it for a Hopper GPU and show what only the GPU compiler rejects.
"""
import contextlib
import inspect
from dataclasses import dataclass

import numpy as np

from . import backend


OUTSIDE = "outside every tensor it was given"  # in every report of this check


class OutOfBounds(AssertionError):
    """A kernel touched memory outside every tensor of its launch."""


@dataclass(frozen=True)
class Launch:
    path: str
    kernel: str
    types: tuple        # ((argument, Triton type), ...) for the runtime arguments
    constexprs: tuple | None  # ((argument, value), ...), JSON-able (a tl.dtype as "tl.dtype:fp32"); None: not
    num_warps: int            # every value could be written so, and the launch cannot be compiled elsewhere


_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int32": "i32",
          "int64": "i64", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}


def _type_of(value) -> str | None:
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        return "*" + _TYPES.get(str(value.dtype).removeprefix("torch."), "fp32")
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
    if isinstance(value, float):
        return "fp32"
    return None


def _portable(constexprs: dict) -> tuple | None:
    """constexpr values as JSON-able values (course/triton_ptx.py rebuilds the tl.dtypes), or None."""
    out = []
    for name, value in constexprs.items():
        if isinstance(value, (int, float, bool, str, type(None))):
            out.append((name, value))
        elif type(value).__name__ == "dtype" and hasattr(value, "name"):
            out.append((name, f"tl.dtype:{value.name}"))
        else:
            return None
    return tuple(out)


def _extent(t) -> tuple[int, int]:
    """[first byte, one past the last byte] of tensor `t`'s elements."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


class _Launch:
    """The tensors of one launch and what fell outside them."""

    def __init__(self, named: dict):
        self.tensors = [(name, *_extent(t)) for name, t in named.items() if hasattr(t, "data_ptr")]
        spans = sorted((lo, hi) for _, lo, hi in self.tensors if hi > lo)
        merged = []
        for lo, hi in spans:
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self.lo = np.array([m[0] for m in merged], dtype=np.uint64)
        self.hi = np.array([m[1] for m in merged], dtype=np.uint64)
        self.stray = {"load": [0, None, 1], "store": [0, None, 1]}  # count, first address, element size

    def inside(self, addresses: np.ndarray, size: int) -> np.ndarray:
        if not len(self.lo):
            return np.zeros(addresses.shape, dtype=bool)
        i = np.searchsorted(self.lo, addresses, side="right").astype(np.int64) - 1
        j = np.clip(i, 0, None)
        return (i >= 0) & (addresses + np.uint64(size) <= self.hi[j])

    def note(self, kind: str, addresses: np.ndarray, size: int):
        entry = self.stray[kind]
        if entry[1] is None:
            entry[1], entry[2] = int(addresses.flat[0]), size
        entry[0] += int(addresses.size)

    def where(self, address: int, size: int) -> str:
        past = [(address - hi, name) for name, lo, hi in self.tensors if address >= hi]
        if past:
            gap, name = min(past)
            n = gap // size + 1
            return f"{n} element{'s' if n > 1 else ''} past the end of `{name}`"
        before = [(lo - address, name) for name, lo, hi in self.tensors if address < lo]
        gap, name = min(before)
        n = -(-gap // size)
        return f"{n} element{'s' if n > 1 else ''} before the start of `{name}`"

    def verdict(self, kernel: str) -> str:
        for kind, fix in (("store", "mask the store (`mask=` in tl.store)"),
                          ("load", "mask the load (`mask=` and `other=` in tl.load)")):
            count, first, size = self.stray[kind]
            if count:
                verb = "stored" if kind == "store" else "loaded"
                return (f"`{kernel}` {verb} {count} elements {OUTSIDE} (the first is "
                        f"{self.where(first, size)}): {fix}, so the last, partial block stays inside the tensor, "
                        f"or look for an index or a stride that runs past it. On a GPU this corrupts memory or "
                        f"faults; the CPU interpreter would not have told you.")
        return ""


_current: list = []  # the launch being interpreted (innermost last)


def _element_size(ptrs) -> int:
    return max(ptrs.get_element_ty().primitive_bitwidth // 8, 1)


def _checked(kind: str, original):
    def op(self, ptrs, *rest):
        if not _current:
            return original(self, ptrs, *rest)
        launch = _current[-1]
        mask_at = 0 if kind == "load" else 1
        mask = rest[mask_at]
        addresses = np.asarray(ptrs.data, dtype=np.uint64)
        wanted = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        size = _element_size(ptrs)
        ok = launch.inside(addresses, size)
        outside = wanted & ~ok
        if outside.any():
            launch.note(kind, addresses[outside], size)
            mask = type(mask)(np.ascontiguousarray(wanted & ok), mask.dtype)
            rest = tuple(mask if i == mask_at else r for i, r in enumerate(rest))
        return original(self, ptrs, *rest)
    return op


@contextlib.contextmanager
def watching():
    """Check and record every Triton launch in the interpreter while the block runs; yields the list of Launches."""
    launches: list[Launch] = []
    if backend.ON_GPU:
        yield launches
        return
    from triton.runtime import interpreter
    builder, function = interpreter.InterpreterBuilder, interpreter.InterpretedFunction
    saved = (builder.create_masked_load, builder.create_masked_store, function.run)

    def run(self, *args, grid, warmup, **kwargs):
        if warmup:
            return saved[2](self, *args, grid=grid, warmup=warmup, **kwargs)
        bound = dict(zip(self.arg_names, args))
        bound.update({k: v for k, v in kwargs.items() if k in self.arg_names})
        constexprs = {n for n, p in inspect.signature(self.fn).parameters.items()
                      if "constexpr" in str(p.annotation)}
        launches.append(Launch(
            inspect.getsourcefile(self.fn) or "", self.fn.__name__,
            tuple((n, _type_of(v)) for n, v in bound.items() if n not in constexprs and _type_of(v)),
            _portable({n: v for n, v in bound.items() if n in constexprs}), int(kwargs.get("num_warps", 4))))
        _current.append(_Launch(bound))
        try:
            result = saved[2](self, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            launch = _current.pop()
        problem = launch.verdict(self.fn.__name__)
        if problem:
            raise OutOfBounds(problem)
        return result

    builder.create_masked_load = _checked("load", saved[0])
    builder.create_masked_store = _checked("store", saved[1])
    function.run = run
    try:
        yield launches
    finally:
        builder.create_masked_load, builder.create_masked_store, function.run = saved
