"""The production kernels a user would pick instead of the course's, for the benchmarks of weeks 33-34.

Owns: how each peer library is called for each op (QuACK, Liger-Kernel, torch.compile of the PyTorch code). Every
function returns {peer name: zero-argument callable}; a peer that is not installed, or will not load with this
machine's versions, is still there as a callable that raises with the reason, so the benchmark records why it has
no number (course.bench.timed turns the exception into NaN and a note). Nothing here runs without a GPU.
"""
import functools

import torch
import torch.nn.functional as F


def _library(name: str):
    """The imported module, or the reason it cannot be imported (one line)."""
    try:
        return __import__(name, fromlist=["_"]), ""
    except Exception as exc:  # noqa: BLE001 - missing, or built for other CUDA / torch / triton versions
        first = (str(exc).splitlines() or [""])[0][:100]
        return None, f"{name} not usable here: {type(exc).__name__}: {first}"


def _unavailable(why: str):
    def fail():
        raise RuntimeError(why)
    return fail


def _from(module: str, build):
    """build(module) -> callable, or a callable that raises why the module cannot be used."""
    lib, why = _library(module)
    return _unavailable(why) if lib is None else build(lib)


@functools.cache  # one compiled callable per op, made once: building it on every call would be charged to its call
def compiled(fn):
    """torch.compile of the PyTorch code (default mode), one per op; shapes specialise as they come."""
    import torch._dynamo
    for knob in ("recompile_limit", "cache_size_limit"):  # every benchmarked size is its own specialisation
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    import torch._functorch.config
    # the benchmark runs one backward again and again (retain_graph); donated buffers forbid that
    torch._functorch.config.donated_buffer = False
    return torch.compile(fn)


def _softmax(x):
    return torch.softmax(x, dim=-1)


def softmax(x: torch.Tensor) -> dict:
    return {"quack.softmax": _from("quack", lambda q: lambda: q.softmax(x)),
            "liger softmax": _from("liger_kernel.ops.softmax", lambda m: lambda: m.LigerSoftmaxFunction.apply(x)),
            "torch.compile softmax": lambda: compiled(_softmax)(x)}


def _layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def _rms_norm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, eps=1e-5)


def _add_rms_norm(x, r, w):
    h = x + r
    return F.rms_norm(h, (x.shape[-1],), w, eps=1e-5), h


def norms_forward(x, w, b) -> dict:
    """LayerNorm and RMSNorm forward: {peer: (course kernel it stands beside, fn)}."""
    w32, b32 = w.float(), b.float()  # QuACK's LayerNorm takes float32 weights
    return {
        "quack layernorm": ("layernorm", _from("quack.rmsnorm", lambda q: lambda: q.layernorm_fwd(x, w32, b32, 1e-5))),
        "liger layernorm": ("layernorm", _from("liger_kernel.ops.layer_norm",
                                               lambda m: lambda: m.LigerLayerNormFunction.apply(x, w, b, 1e-5))),
        "torch.compile layer_norm": ("layernorm", lambda: compiled(_layer_norm)(x, w, b)),
        "quack rmsnorm": ("rmsnorm", _from("quack", lambda q: lambda: q.rmsnorm(x, w, eps=1e-5))),
        "liger rmsnorm": ("rmsnorm", _from("liger_kernel.ops.rms_norm",
                                           lambda m: lambda: m.LigerRMSNormFunction.apply(x, w, 1e-5, 0.0, "llama",
                                                                                          False))),
        "torch.compile rms_norm": ("rmsnorm", lambda: compiled(_rms_norm)(x, w)),
    }


def fused_add_rmsnorm(x, r, w) -> dict:
    return {
        "quack add+rmsnorm": _from("quack", lambda q: lambda: q.rmsnorm(x, w, residual=r, prenorm=True, eps=1e-5)),
        "liger add+rmsnorm": _from("liger_kernel.ops.fused_add_rms_norm",
                                   lambda m: lambda: m.LigerFusedAddRMSNormFunction.apply(x, r, w, 1e-5)),
        "torch.compile add+rms_norm": lambda: compiled(_add_rms_norm)(x, r, w),
    }


def norms_backward(x, w, b, dy) -> dict:
    """Backward of both norms from saved statistics where the library exposes it (QuACK), else through autograd
    (Liger, torch.compile): {peer: (course kernel, fn)}."""
    entries = {}
    lib, why = _library("quack.rmsnorm")
    if lib is None:
        entries["quack layernorm backward"] = ("layernorm_backward", _unavailable(why))
        entries["quack rmsnorm backward"] = ("rmsnorm_backward", _unavailable(why))
    else:
        w32 = w.float()
        try:  # the statistics the backward reads, from QuACK's own forward
            _, rstd, mean = lib.layernorm_fwd(x, w32, b.float(), 1e-5, return_rstd=True, return_mean=True)
            _, _, rms_rstd = lib.rmsnorm_fwd(x, w, eps=1e-5, store_rstd=True)
            layernorm = lambda: lib.layernorm_bwd(x, w32, dy, rstd, mean)  # noqa: E731
            rmsnorm = lambda: lib.rmsnorm_bwd(x, w, dy, rms_rstd)  # noqa: E731
        except Exception as exc:  # noqa: BLE001 - recorded on the peer's rows
            layernorm = rmsnorm = _unavailable(f"forward failed: {type(exc).__name__}: {str(exc)[:100]}")
        entries["quack layernorm backward"] = ("layernorm_backward", layernorm)
        entries["quack rmsnorm backward"] = ("rmsnorm_backward", rmsnorm)
    for peer, course, forward in (
            ("liger layernorm backward", "layernorm_backward", _from(
                "liger_kernel.ops.layer_norm",
                lambda m: lambda x, w, b: m.LigerLayerNormFunction.apply(x, w, b, 1e-5))),
            ("liger rmsnorm backward", "rmsnorm_backward", _from(
                "liger_kernel.ops.rms_norm",
                lambda m: lambda x, w, b: m.LigerRMSNormFunction.apply(x, w, 1e-5, 0.0, "llama", False))),
            ("torch.compile layer_norm backward", "layernorm_backward", compiled(_layer_norm)),
            ("torch.compile rms_norm backward", "rmsnorm_backward", lambda x, w, b: compiled(_rms_norm)(x, w))):
        entries[peer] = (course, _through_autograd(forward, x, w, b, dy))
    return entries


def _through_autograd(forward, x, w, b, dy):
    """fn() computing the gradients of forward(x, w, b) for dy, the forward run once outside the timing."""
    xg, wg, bg = (t.detach().clone().requires_grad_() for t in (x, w, b))
    try:
        y = forward(xg, wg, bg)
    except Exception as exc:  # noqa: BLE001 - recorded on the peer's row
        return _unavailable(f"forward failed: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
    return lambda: torch.autograd.grad(y, (xg, wg, bg), dy, retain_graph=True, allow_unused=True)


def flash_attention_4():
    """FlashAttention-4 (flash-attn-4, written in the CuTe DSL) as (q, k, v, causal) -> o on (B, H, N, d) tensors,
    the layout of the course's kernels and SDPA; it takes (B, N, H, d), so the heads axis is swapped in a view."""
    lib, why = _library("flash_attn.cute")
    if lib is None:
        fail = _unavailable(why)
        return lambda q, k, v, causal: fail()

    def run(q, k, v, causal):
        out = lib.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)
    return run
