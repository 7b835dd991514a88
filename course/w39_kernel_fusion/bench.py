"""Week 39 benchmark, one run: every fused kernel of the week against what a practitioner would run instead.

Parts (`python -m course bench w39`, resumable with --resume; each row: part, stage, kernel, peer, dtype, shape, the
kernel alone `ms` and the time per call `call_ms` (course/bench.py `timed`), host_us, GB/s or TFLOP/s):
- elementwise: bias + GELU (erf and tanh), SwiGLU, GeGLU (tanh), dropout + residual, dropout + residual + LayerNorm,
  forward and backward, at rows x hidden from 4096 x 1024 to 32768 x 8192, fp32 and bf16. Peers: the same PyTorch code
  eager (the row's `peer`), torch.compile of it (default mode, and max-autotune-no-cudagraphs in bf16 at 8192 x
  4096), and
  Liger-Kernel where it has the op. GB/s from the fused kernel's minimum bytes (reference.stage_bytes) for every
  row, so a peer that moves more bytes shows up as fewer GB/s; `vs_copy` is the share of the copy ceiling;
  `vs_torch`, `vs_compile`, `vs_autotune`, `vs_liger` the course kernel's GB/s over each peer's (kernel alone), and
  `call_vs_*` the same per call;
- epilogue: matmul + bias + GELU in one Triton kernel against cuBLAS's GEMM alone and cuBLAS + a separate GELU
  (TFLOP/s of the GEMM, 2MNK);
- attention (bf16, d = 128, B·N = 16384 tokens, 16 heads): RoPE inside attention against the same attention without
  RoPE, week 35's RoPE kernel + attention, PyTorch's rotation + SDPA (FlashAttention-2), Liger's RoPE + SDPA; ALiBi
  made inside the kernel against SDPA with a materialised bias; attention with the output projection in its epilogue
  against attention + a GEMM; the QKV GEMM with RoPE in its epilogue against the GEMM + week 35's RoPE kernel."""
import math

import pandas as pd

from .. import attention_cost, bench, peers
from . import reference as ref

SIZES = ((4096, 1024), (8192, 4096), (16384, 8192), (32768, 8192))
AUTOTUNE_SIZE = (8192, 4096)  # max-autotune-no-cudagraphs compiles for minutes: bf16 at this size only
P, SEED = 0.1, 1234
GEMM_SIZES = (4096, 8192)
TOKENS, HEADS, HEAD_DIM = 16384, 16, 128
ATTENTION_N = (1024, 4096, 16384)
PROJECTION_N = (1024, 4096)
AUTOTUNE = "max-autotune-no-cudagraphs"
DEVICE = "cuda"


def _compiled(fn, mode=None):
    """peers.compiled for the default mode; a separate cache per mode."""
    return peers.compiled(fn) if mode is None else _compiled_mode(fn, mode)


_MODES = {}


def _compiled_mode(fn, mode):
    import torch
    key = (fn, mode)
    if key not in _MODES:
        peers.compiled(fn)  # the shared dynamo settings
        _MODES[key] = torch.compile(fn, mode=mode)
    return _MODES[key]


# ---------------------------------------------------------------- the PyTorch code each fused kernel replaces
def _bias_gelu(x, b, approximate):
    import torch.nn.functional as F
    return F.gelu(x + b, approximate=approximate)


def _swiglu(g, u):
    import torch.nn.functional as F
    return F.silu(g) * u


def _geglu(g, u):
    import torch.nn.functional as F
    return F.gelu(g, approximate="tanh") * u


def _dropout_residual(x, r, p):
    import torch.nn.functional as F
    return F.dropout(x, p, training=True) + r


def _dropout_residual_layernorm(x, r, w, b, p):
    import torch.nn.functional as F
    h = F.dropout(x, p, training=True) + r
    return F.layer_norm(h, (h.shape[-1],), w, b, eps=1e-5), h


def _grads(forward, inputs, upstream):
    """fn() computing the gradients of forward(*inputs) (tensors that need them: the float ones) for the upstream
    gradients of its first outputs (dropout + residual + LayerNorm: y's only, as the course's backward with dh=None),
    the forward run once outside the timing; or a callable that raises why the forward failed."""
    import torch
    leaves = [t.detach().clone().requires_grad_() if isinstance(t, torch.Tensor) else t for t in inputs]
    try:
        out = forward(*leaves)
    except Exception as exc:  # noqa: BLE001 - recorded on the peer's rows
        return peers._unavailable(f"forward failed: {bench.reason(exc)}")
    outs = out if isinstance(out, tuple) else (out,)
    wanted = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    # gradients flow from the outputs that have an upstream gradient (the first ones), as in the course's backward
    return lambda: torch.autograd.grad(outs[:len(upstream)], wanted, upstream, retain_graph=True, allow_unused=True)


def _with_peers(name, course_fn, forward, inputs, backward_of=False, upstream=None, liger=None, autotune=False):
    """{kernel: (peer, build)} for one stage, build() giving the zero-argument callable to time: the course kernel,
    the eager PyTorch code, torch.compile of it (and max-autotune-no-cudagraphs), Liger where given. A backward's
    callables hold an autograd graph each, so they are built one at a time, just before their timing."""
    eager = f"torch {name}"
    fns = {eager: forward, f"torch.compile {name}": _compiled(forward)}
    if autotune:
        fns[f"max-autotune {name}"] = _compiled(forward, AUTOTUNE)
    if liger:
        fns[f"liger {name}"] = liger
    entries = {name: (eager, lambda: course_fn)}
    for kernel, fn in fns.items():
        entries[kernel] = (eager, (lambda fn=fn: _grads(fn, inputs, upstream)) if backward_of else
                           (lambda fn=fn: lambda: fn(*inputs)))
    return entries


def _liger(module, cls):
    lib, why = peers._library(f"liger_kernel.ops.{module}")
    return peers._unavailable(why) if lib is None else getattr(lib, cls).apply


def elementwise_cases(s, m, n, dtype, autotune):
    """{stage: {kernel: (peer, fn)}} at one size."""
    import torch
    dt = getattr(torch, dtype)
    x, r, dy, g, u = (torch.randn(m, n, device=DEVICE, dtype=dt) for _ in range(5))
    b = 0.1 * torch.randn(n, device=DEVICE, dtype=dt)
    w = 1 + 0.1 * torch.randn(n, device=DEVICE, dtype=dt)
    out = torch.empty_like(x)
    y, h, mean, rstd = s.dropout_residual_layernorm(x, r, w, b, P, SEED)
    liger_swiglu, liger_geglu = _liger("swiglu", "LigerSiLUMulFunction"), _liger("geglu", "LigerGELUMulFunction")
    liger_ln = _liger("layer_norm", "LigerLayerNormFunction")

    def liger_dropout_residual_layernorm(x, r, w, b, p):
        import torch.nn.functional as F
        h = F.dropout(x, p, training=True) + r
        return liger_ln(h, w, b, 1e-5), h

    stages = {}
    for approximate in ("none", "tanh"):
        stages[f"bias_gelu {approximate}"] = _with_peers(
            f"bias_gelu {approximate}", lambda a=approximate: s.bias_gelu(x, b, a, out),
            _bias_gelu, (x, b, approximate), autotune=autotune)
        stages[f"bias_gelu_backward {approximate}"] = _with_peers(
            f"bias_gelu_backward {approximate}", lambda a=approximate: s.bias_gelu_backward(x, b, dy, a),
            _bias_gelu, (x, b, approximate), backward_of=True, upstream=(dy,), autotune=autotune)
    stages["cuda_bias_gelu none"] = {"cuda_bias_gelu none": ("torch bias_gelu none",
                                                             lambda: lambda: s.cuda_bias_gelu(x, b, "none", out))}
    stages["swiglu"] = _with_peers("swiglu", lambda: s.swiglu(g, u, out), _swiglu, (g, u), liger=liger_swiglu,
                                   autotune=autotune)
    stages["swiglu_backward"] = _with_peers("swiglu_backward", lambda: s.swiglu_backward(g, u, dy), _swiglu, (g, u),
                                            backward_of=True, upstream=(dy,), liger=liger_swiglu, autotune=autotune)
    stages["geglu"] = _with_peers("geglu", lambda: s.geglu(g, u, "tanh", out), _geglu, (g, u), liger=liger_geglu,
                                  autotune=autotune)
    stages["geglu_backward"] = _with_peers("geglu_backward", lambda: s.geglu_backward(g, u, dy, "tanh"), _geglu,
                                           (g, u), backward_of=True, upstream=(dy,), liger=liger_geglu,
                                           autotune=autotune)
    stages["dropout_residual"] = _with_peers(
        "dropout_residual", lambda: s.dropout_residual_forward(x, r, P, SEED, 0, out), _dropout_residual, (x, r, P),
        autotune=autotune)
    stages["dropout_residual_backward"] = _with_peers(
        "dropout_residual_backward", lambda: s.dropout_residual_backward(dy, P, SEED, 0, out), _dropout_residual,
        (x, r, P), backward_of=True, upstream=(dy,), autotune=autotune)
    stages["dropout_residual_layernorm"] = _with_peers(
        "dropout_residual_layernorm", lambda: s.dropout_residual_layernorm(x, r, w, b, P, SEED),
        _dropout_residual_layernorm, (x, r, w, b, P), liger=liger_dropout_residual_layernorm, autotune=autotune)
    stages["dropout_residual_layernorm_backward"] = _with_peers(
        "dropout_residual_layernorm_backward",
        lambda: s.dropout_residual_layernorm_backward(dy, h, w, mean, rstd, P, SEED, 0),
        _dropout_residual_layernorm, (x, r, w, b, P), backward_of=True, upstream=(dy,),
        liger=liger_dropout_residual_layernorm, autotune=autotune)
    return stages


def elementwise_rows(s, rows, dtype):
    import torch
    ceiling = bench.copy_ceiling_gbps()
    size = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    for m, n in SIZES:
        shape = {"part": f"elementwise_{dtype}", "dtype": dtype, "M": m, "N": n}
        why = bench.fits(16 * m * n * size)  # five inputs, outputs, autograd's saved tensors and gradients
        if why:
            rows.append({**shape, "kernel": "all", **bench.missed(why)})
            continue
        autotune = dtype == "bfloat16" and (m, n) == AUTOTUNE_SIZE
        for stage, kernels in elementwise_cases(s, m, n, dtype, autotune).items():
            nbytes = ref.stage_bytes(stage.split()[0], m, n, size)
            for kernel, (peer, build) in kernels.items():
                fn = build()
                rows.append({**shape, "stage": stage, "kernel": kernel, "peer": peer,
                             **bench.rates(bench.timed(fn), nbytes, ceiling), "copy_ceiling_GB/s": ceiling})
                del fn
        torch.cuda.empty_cache()
    return rows


def epilogue_rows(s, rows):
    import torch
    import torch.nn.functional as F
    for n in GEMM_SIZES:
        a, w = (torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16) / 8 for _ in range(2))
        bias = torch.randn(n, device=DEVICE, dtype=torch.bfloat16)
        out = torch.empty(n, n, device=DEVICE, dtype=torch.bfloat16)
        shape = {"part": "epilogue", "stage": "matmul_bias_gelu", "dtype": "bfloat16", "M": n, "N": n, "K": n,
                 "peer": "cuBLAS matmul"}
        for kernel, fn in (("matmul_bias_gelu", lambda: s.matmul_bias_gelu(a, w, bias, "tanh", out)),
                           ("cuBLAS matmul", lambda: torch.matmul(a, w, out=out)),
                           ("cuBLAS addmm + F.gelu", lambda: F.gelu(torch.addmm(bias, a, w), approximate="tanh")),
                           ("torch.compile matmul + bias + gelu",
                            lambda: _compiled(_matmul_bias_gelu)(a, w, bias))):
            rows.append({**shape, "kernel": kernel, **bench.with_rates(bench.timed(fn), flops=2 * n ** 3)})
    return rows


def _matmul_bias_gelu(a, w, bias):
    import torch.nn.functional as F
    return F.gelu(a @ w + bias, approximate="tanh")


def _rotate(x, cos, sin):
    """PyTorch's rotation, "rotate half" layout: (x1, x2) -> (x1·cos − x2·sin, x2·cos + x1·sin)."""
    import torch
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def attention_rows(s, rows):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..registry import kernels
    from ..w35_attention_blocks import reference as ref35
    s35 = kernels("w35_attention_blocks")
    liger_rope = _liger("rope", "LigerRopeFunction")
    for n in ATTENTION_N:
        batch = TOKENS // n
        q, k, v = (torch.randn(batch, HEADS, n, HEAD_DIM, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
        cos64, sin64 = ref35.rope_tables(n, HEAD_DIM)
        cos, sin = (torch.tensor(t, device=DEVICE, dtype=torch.bfloat16) for t in (cos64, sin64))
        cos_full, sin_full = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)  # (N, d): Liger's layout
        slopes = torch.tensor(ref35.alibi_slopes(HEADS), device=DEVICE, dtype=torch.float32)
        bias = torch.tensor(ref35.alibi_bias(n, n, ref35.alibi_slopes(HEADS)), device=DEVICE, dtype=torch.bfloat16) \
            if not bench.fits(HEADS * n * n * 2, share=0.3) else None

        def sdpa(q, k, v, causal, backend=SDPBackend.FLASH_ATTENTION, **kwargs):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kwargs)

        for causal in (False, True):
            shape = {"part": "attention", "dtype": "bfloat16", "B": batch, "H": HEADS, "N": n, "d": HEAD_DIM,
                     "mask": "causal" if causal else "none"}
            flops = attention_cost.attention_flops(batch * HEADS, n, n, HEAD_DIM, causal)
            stages = {
                "rope": ("flash_attention (no RoPE)", {
                    "rope_attention": lambda: s.rope_attention(q, k, v, cos, sin, causal),
                    "flash_attention (no RoPE)": lambda: s.flash_attention(q, k, v, causal),
                    "rope kernel + flash_attention": lambda: s.flash_attention(
                        s35.rope(q, cos, sin), s35.rope(k, cos, sin), v, causal),
                    "torch rotation + SDPA FlashAttention-2": lambda: sdpa(
                        _rotate(q, cos, sin), _rotate(k, cos, sin), v, causal),
                    "liger rope + SDPA FlashAttention-2": lambda: sdpa(
                        *liger_rope(q, k, cos_full, sin_full), v, causal)}),
                "alibi": ("flash_attention (no bias)", {
                    "alibi_attention": lambda: s.alibi_attention(q, k, v, slopes, causal),
                    "flash_attention (no bias)": lambda: s.flash_attention(q, k, v, causal),
                    "SDPA with a materialised ALiBi bias": (lambda: sdpa(
                        q, k, v, False, SDPBackend.EFFICIENT_ATTENTION,
                        attn_mask=bias + (torch.full((n, n), -math.inf, device=DEVICE, dtype=torch.bfloat16).triu(1)
                                          if causal else 0))) if bias is not None else
                    peers._unavailable("the (H, N, N) bias does not fit")}),
            }
            for stage, (peer, kernels_of) in stages.items():
                for kernel, fn in kernels_of.items():
                    rows.append({**shape, "stage": stage, "kernel": kernel, "peer": peer,
                                 **bench.with_rates(bench.timed(fn), flops=flops)})
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def projection_rows(s, rows):
    """Attention with O·W_Oᵀ in its epilogue, and the QKV GEMM with RoPE in its epilogue, against the unfused pairs."""
    import torch

    from ..registry import kernels
    from ..w35_attention_blocks import reference as ref35
    s35 = kernels("w35_attention_blocks")
    c = HEADS * HEAD_DIM
    for n in PROJECTION_N:
        batch = TOKENS // n
        q, k, v = (torch.randn(batch, HEADS, n, HEAD_DIM, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
        w_o = torch.randn(c, c, device=DEVICE, dtype=torch.bfloat16) / math.sqrt(c)
        x = torch.randn(batch, n, c, device=DEVICE, dtype=torch.bfloat16)
        w_qkv = torch.randn(3 * c, c, device=DEVICE, dtype=torch.bfloat16) / math.sqrt(c)
        cos, sin = (torch.tensor(t, device=DEVICE, dtype=torch.bfloat16) for t in ref35.rope_tables(n, HEAD_DIM))

        def attention_then_gemm():
            o, _ = s.flash_attention(q, k, v, True)
            return o.transpose(1, 2).reshape(batch, n, c) @ w_o.t()

        def gemm_then_rope():
            q_, k_, v_ = s35.qkv_projection(x, w_qkv, None, HEADS)
            return s35.rope(q_, cos, sin), s35.rope(k_, cos, sin), v_

        flops_attention = attention_cost.attention_flops(batch * HEADS, n, n, HEAD_DIM, True) + 2 * batch * n * c * c
        flops_qkv = 2 * batch * n * c * 3 * c
        shape = {"part": "projection", "dtype": "bfloat16", "B": batch, "H": HEADS, "N": n, "d": HEAD_DIM}
        for stage, peer, flops, entries in (
                ("output projection", "flash_attention + GEMM", flops_attention, {
                    "attention_output_projection": lambda: s.attention_output_projection(q, k, v, w_o, None, True),
                    "flash_attention + GEMM": attention_then_gemm}),
                ("qkv projection", "GEMM + rope kernel", flops_qkv, {
                    "qkv_rope_projection": lambda: s.qkv_rope_projection(x, w_qkv, None, cos, sin, HEADS),
                    "GEMM + rope kernel": gemm_then_rope})):
            for kernel, fn in entries.items():
                rows.append({**shape, "stage": stage, "kernel": kernel, "peer": peer, "mask": "causal",
                             **bench.with_rates(bench.timed(fn), flops=flops)})
        del q, k, v, x
        torch.cuda.empty_cache()
    return rows


def elementwise_bfloat16_rows(s, rows):
    return elementwise_rows(s, rows, "bfloat16")


def elementwise_float32_rows(s, rows):
    return elementwise_rows(s, rows, "float32")


PARTS = ("elementwise_bfloat16", "elementwise_float32", "epilogue", "attention", "projection")
LIBRARIES = {"compile": "torch.compile", "autotune": "max-autotune", "liger": "liger"}


def run(parts=PARTS, rows=None) -> pd.DataFrame:
    from ..registry import kernels
    s = kernels("w39_kernel_fusion")
    matmul = bench.matmul_ceiling_tflops()
    rows = bench.run_parts({p: lambda rows, p=p: globals()[f"{p}_rows"](s, rows) for p in parts},
                           desc="w39 kernel fusion", rows=rows)
    table = pd.DataFrame(rows)
    for column in ("stage", "peer", "dtype", "M", "N", "K", "B", "H", "d", "mask", "GB/s", "call_GB/s", "TFLOP/s",
                   "call_TFLOP/s"):
        if column not in table:  # a run of some parts may have none of a column
            table[column] = math.nan
    table["note"] = table["note"].fillna("") if "note" in table else ""
    elementwise = table["part"].str.startswith("elementwise")
    keys = ["part", "dtype", "M", "N"]
    ew = table[elementwise].copy()
    ew = bench.versus(ew, lambda r: (r["part"], r["dtype"], r["M"], r["N"], r["peer"]), keys + ["kernel"], "vs_torch")
    for library, prefix in LIBRARIES.items():
        ew = bench.versus(ew, lambda r, prefix=prefix: (r["part"], r["dtype"], r["M"], r["N"],
                                                        f"{prefix} {r['kernel']}"), keys + ["kernel"], f"vs_{library}")
    table = pd.concat([ew, table[~elementwise]], ignore_index=True)
    table = bench.speedups(table, ["part", "stage", "dtype", "M", "N", "K", "B", "d", "mask"])
    table["matmul_ceiling_TFLOP/s"] = round(matmul, 1)
    table["vs_matmul"] = (table["TFLOP/s"] / matmul).round(3)
    return table.round({"ms": 4, "call_ms": 4, "host_us": 1, "GB/s": 1, "call_GB/s": 1, "TFLOP/s": 1,
                        "call_TFLOP/s": 1, "speedup": 2, "call_speedup": 2})
