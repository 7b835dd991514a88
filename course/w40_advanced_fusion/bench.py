"""Week 40 benchmark, one run (`python -m course bench w40`, resumable with --resume). Every row: part, kernel, peer,
dtype, shape, the kernel alone `ms` and the time per call `call_ms` (course/bench.py `timed`), TFLOP/s, and `speedup`
(the peer's time over the row's, kernels alone; `call_speedup` per call). Parts, all bf16 on one GPU:
- linear: causal chunked linear attention (elu + 1) at d = 128, 16 heads, N from 1024 to 32768, against
  flash-linear-attention's chunk kernel (fla, the feature map applied by PyTorch first: the row's peer) and against
  the course's causal FlashAttention (week 38) and SDPA's FlashAttention-2 at the same N (`vs_flash`: the course's
  FlashAttention time over the row's);
- block_sparse: attention under a sliding window of 1024 keys (causal), a causal mask and a document mask at
  N = 16384 (and the window at N = 4096), forward and forward + backward, against FlexAttention with the same block
  mask; TFLOP/s count the kept pairs only (4·d FLOPs each forward);
- capstone: a training step (forward + backward) of the pre-norm block of the course's kernels at B·N = 16384 tokens,
  C = 2048, 16 heads, F = 5632 (and at 2048 tokens), against the same block in eager PyTorch and torch.compile of it
  (the peer), and the course's block with SDPA's attention in place of its own (day 5's decision); then each stage of the course's block timed alone at the large size (`part` capstone_stages), with
  its FLOPs and bytes from reference.capstone_stage_costs, for the breakdown and the roofline;
- shoulders: the course's attention forward and backward (week 38) against SDPA's FlashAttention-2 and cuDNN
  backends, FlexAttention and FlashAttention-4 (where it runs), causal and not, d = 128, B·N = 16384;
- cute_gemm: the CuTe DSL GEMM of day 1 against cuBLAS (torch.matmul) at 4096 and 8192 (where the DSL runs).
Both ceilings (copy bandwidth, dense bf16 matmul) are measured in the same run and stamped on every row."""
import math

import pandas as pd

from .. import attention_cost, bench, peers
from . import reference as ref

DEVICE = "cuda"
HEADS, HEAD_DIM = 16, 128
LINEAR_N = (1024, 4096, 16384, 32768)
SPARSE_N, WINDOW = 16384, 1024
TOKENS, MODEL, FFN = 16384, 2048, 5632
CAPSTONE_SHAPES = ((8, 2048), (4, 4096), (1, 2048))  # (B, N): B·N = 16384 tokens, and a small batch
P, SEED = 0.1, 1234
GEMM_SIZES = (4096, 8192)


def _heads(batch, n, grad=False):
    import torch
    return [torch.randn(batch, HEADS, n, HEAD_DIM, device=DEVICE, dtype=torch.bfloat16, requires_grad=grad)
            for _ in range(3)]


def _row(rows, shape, kernel, peer, times, flops):
    rows.append({**shape, "kernel": kernel, "peer": peer, **bench.with_rates(times, flops=flops)})


# ---------------------------------------------------------------- linear attention against fla and flash
def linear_rows(s, rows):
    import torch
    import torch.nn.functional as F
    fla, why = peers._library("fla.ops.linear_attn")
    flash = s_flash()
    for n in LINEAR_N:
        q, k, v = _heads(1, n)
        shape = {"part": "linear", "dtype": "bfloat16", "B": 1, "H": HEADS, "N": n, "d": HEAD_DIM, "mask": "causal"}
        flops = ref.linear_attention_flops(HEADS, n, HEAD_DIM, 64)
        peer = "fla chunk_linear_attn (+ elu + 1)"
        if fla is not None:
            qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # fla's layout (B, N, H, d)

            def fla_call():
                return fla.chunk_linear_attn(F.elu(qt) + 1, F.elu(kt) + 1, vt, normalize=True)
            fq, fk = F.elu(qt) + 1, F.elu(kt) + 1
            peer_fns = {peer: fla_call, "fla chunk_linear_attn (features given)":
                        lambda: fla.chunk_linear_attn(fq, fk, vt, normalize=True)}
        else:
            peer_fns = {peer: peers._unavailable(why)}
        fns = {"causal_linear_attention": lambda: s.causal_linear_attention(q, k, v), **peer_fns}
        for kernel, fn in fns.items():
            _row(rows, shape, kernel, peer, bench.timed(fn), flops)
        attention = attention_cost.attention_flops(HEADS, n, n, HEAD_DIM, True)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def fa2():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        for kernel, fn in (("flash_forward (course, causal)", lambda: flash.flash_forward(q, k, v, True)),
                           ("SDPA FlashAttention-2 (causal)", fa2)):
            _row(rows, shape, kernel, peer, bench.timed(fn), attention)
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def s_flash():
    from ..registry import kernels
    return kernels("w38_flash_attention_impl")


# ---------------------------------------------------------------- block-sparse attention against FlexAttention
def _flex_mask(n, causal, window, documents):
    import torch
    from torch.nn.attention.flex_attention import create_block_mask
    docs = None if documents is None else torch.as_tensor(documents, device=DEVICE)

    def keep(b, h, q, k):
        ok = q >= 0
        if causal:
            ok = ok & (k <= q)
        if window is not None:
            ok = ok & (q - k < window)
        if docs is not None:
            ok = ok & (docs[q] == docs[k])
        return ok
    return create_block_mask(keep, None, None, n, n, device=DEVICE)


def sparse_patterns():
    """(name, N, causal, window, documents) of the block_sparse part."""
    import numpy as np
    rng = np.random.default_rng(0)
    lengths = rng.integers(256, 4096, 16)
    documents = np.repeat(np.arange(16), lengths)[:SPARSE_N]
    documents = np.concatenate([documents, np.full(SPARSE_N - len(documents), 16)])
    return (("sliding window 1024, causal", SPARSE_N, True, WINDOW, None),
            ("sliding window 1024, causal", 4096, True, WINDOW, None),
            ("causal", SPARSE_N, True, None, None),
            ("documents (16 of 256-4096 tokens), causal", SPARSE_N, True, None, documents))


def block_sparse_rows(s, rows):
    import torch
    from torch.nn.attention.flex_attention import flex_attention
    flex = torch.compile(flex_attention, dynamic=False)
    for name, n, causal, window, documents in sparse_patterns():
        pattern = s.SparsePattern(n, causal, window, documents)
        block_mask = _flex_mask(n, causal, window, documents)
        keep = ref.token_mask(n, n, causal, window, documents)
        pairs = int(keep.sum())
        q, k, v = _heads(1, n, grad=True)
        do = torch.randn_like(q)
        shape = {"part": "block_sparse", "dtype": "bfloat16", "B": 1, "H": HEADS, "N": n, "d": HEAD_DIM,
                 "mask": name, "density": round(pattern.density, 4)}
        fwd = {"sparse_attention": lambda: s.sparse_attention_forward(q, k, v, pattern),
               "FlexAttention": lambda: flex(q, k, v, block_mask=block_mask)}
        for kernel, fn in fwd.items():
            _row(rows, {**shape, "pass": "forward"}, kernel, "FlexAttention", bench.timed(fn), 4 * HEADS * pairs * HEAD_DIM)
        step = {"sparse_attention": lambda: torch.autograd.grad(s.sparse_attention(q, k, v, pattern), (q, k, v), do),
                "FlexAttention": lambda: torch.autograd.grad(flex(q, k, v, block_mask=block_mask), (q, k, v), do)}
        for kernel, fn in step.items():
            _row(rows, {**shape, "pass": "forward+backward"}, kernel, "FlexAttention", bench.timed(fn),
                 3.5 * 4 * HEADS * pairs * HEAD_DIM)
        del q, k, v, do
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------- the capstone block against eager and compile
def capstone_inputs(bsz, n, grad=True):
    import torch
    c, f = MODEL, FFN
    x = torch.randn(bsz, n, c, device=DEVICE, dtype=torch.bfloat16, requires_grad=grad)
    weights = [torch.ones(c), torch.randn(3 * c, c) * c ** -0.5, torch.randn(c, c) * c ** -0.5, torch.ones(c),
               torch.randn(2 * f, c) * c ** -0.5, torch.randn(c, f) * f ** -0.5]
    weights = [w.to(DEVICE, torch.bfloat16).requires_grad_(grad) for w in weights]
    return x, weights


def _sdpa_causal(q, k, v):
    """PyTorch's scaled_dot_product_attention, causal, with its default choice of backend (cuDNN or
    FlashAttention-2 on Hopper): what reference.torch_block and its compiled form use."""
    import torch.nn.functional as F
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def capstone_rows(s, rows):
    import torch
    compiled = peers.compiled(ref.torch_block)
    for bsz, n in CAPSTONE_SHAPES:
        x, weights = capstone_inputs(bsz, n)
        dy = torch.randn_like(x)
        cos, sin = s.rope_tables(n, MODEL // HEADS, str(x.device))
        leaves = [x, *weights]
        shape = {"part": "capstone", "dtype": "bfloat16", "B": bsz, "N": n, "H": HEADS, "d": HEAD_DIM, "C": MODEL,
                 "F": FFN, "pass": "training step"}
        flops = ref.capstone_step_flops(bsz, n, MODEL, FFN, HEADS)
        steps = {"capstone_block": lambda: s.capstone_block(x, *weights, HEADS, P, SEED),
                 "capstone_block (SDPA attention)": lambda: s.capstone_block(x, *weights, HEADS, P, SEED,
                                                                             attention=_sdpa_causal),
                 "torch eager": lambda: ref.torch_block(x, *weights, HEADS, cos, sin, P),
                 "torch.compile": lambda: compiled(x, *weights, HEADS, cos, sin, P)}
        for kernel, forward in steps.items():
            _row(rows, shape, kernel, "torch.compile", bench.timed(
                lambda forward=forward: torch.autograd.grad(forward(), leaves, dy)), flops)
        del x, weights, leaves, dy
        torch.cuda.empty_cache()
    return rows


def capstone_stages_rows(s, rows):
    """Each stage of the course's block timed alone at (8, 2048), forward and backward, with its cost model."""
    import torch
    bsz, n = CAPSTONE_SHAPES[0]
    x, weights = capstone_inputs(bsz, n, grad=False)
    shape = {"part": "capstone_stages", "dtype": "bfloat16", "B": bsz, "N": n, "H": HEADS, "d": HEAD_DIM, "C": MODEL,
             "F": FFN}
    costs = ref.capstone_stage_costs(bsz, n, MODEL, FFN, HEADS)
    for stage, fn in s.capstone_stages(x, *weights, HEADS, P, SEED).items():
        flops, nbytes = costs[stage]
        rows.append({**shape, "kernel": stage, "peer": "", **bench.with_rates(bench.timed(fn), flops, nbytes)})
    del x, weights
    torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------- the course's attention against production's
def shoulders_rows(s, rows):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flash = s_flash()
    fa4 = peers.flash_attention_4()
    flex = torch.compile(flex_attention, dynamic=False)
    for n in (4096, 16384):
        batch = TOKENS // n
        q, k, v = _heads(batch, n, grad=True)
        do = torch.randn_like(q)
        for causal in (True, False):
            masks = create_block_mask(lambda b, h, qi, ki: ki <= qi, None, None, n, n, device=DEVICE) if causal \
                else None

            def sdpa(backend, causal=causal):
                def run():
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                return run
            forwards = {"flash_attn (course)": lambda: flash.flash_attn(q, k, v, causal),
                        "SDPA FlashAttention-2": sdpa(SDPBackend.FLASH_ATTENTION),
                        "SDPA cuDNN": sdpa(SDPBackend.CUDNN_ATTENTION),
                        "FlexAttention": lambda: flex(q, k, v, block_mask=masks),
                        "FlashAttention-4": lambda: fa4(q, k, v, causal)}
            flops = attention_cost.attention_flops(batch * HEADS, n, n, HEAD_DIM, causal)
            shape = {"part": "shoulders", "dtype": "bfloat16", "B": batch, "H": HEADS, "N": n, "d": HEAD_DIM,
                     "mask": "causal" if causal else "none"}
            for kernel, fn in forwards.items():
                _row(rows, {**shape, "pass": "forward"}, kernel, "SDPA FlashAttention-2", bench.timed(fn), flops)
                _row(rows, {**shape, "pass": "forward+backward"}, kernel, "SDPA FlashAttention-2", bench.timed(
                    lambda fn=fn: torch.autograd.grad(fn(), (q, k, v), do)), 3.5 * flops)
        del q, k, v, do
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------- day 1: the CuTe DSL GEMM against cuBLAS
def cute_gemm_rows(s, rows):
    import torch
    for n in GEMM_SIZES:
        a, b = (torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16) / 8 for _ in range(2))
        shape = {"part": "cute_gemm", "dtype": "bfloat16", "M": n, "N": n, "K": n}
        fns = {"cute_gemm": (lambda: s.cute_gemm(a, b)) if s.CUTE_AVAILABLE else peers._unavailable(s.CUTE_REASON),
               "cuBLAS matmul": lambda: a @ b.T}
        for kernel, fn in fns.items():
            times = bench.timed(fn)
            if kernel == "cute_gemm" and not math.isnan(times["ms"]):  # the DSL launches outside a captured graph
                times["ms"], why = bench.attempt_ms(fn)
                times["note"] = "; ".join(filter(None, (times["note"], why, "ms: eager events (the DSL's launch is "
                                                        "not captured by a CUDA graph)")))
            _row(rows, shape, kernel, "cuBLAS matmul", times, 2 * n ** 3)
    return rows


PARTS = ("linear", "block_sparse", "capstone", "capstone_stages", "shoulders", "cute_gemm")
# the columns that tell one measurement from another in each part: a row's peer is the row with the same values
KEYS = {"linear": ["N"], "block_sparse": ["N", "mask", "pass"], "capstone": ["B", "N", "pass"],
        "capstone_stages": ["kernel"], "shoulders": ["B", "N", "mask", "pass"], "cute_gemm": ["M", "N", "K"]}


def run(parts=PARTS, rows=None) -> pd.DataFrame:
    from ..registry import kernels
    s = kernels("w40_advanced_fusion")
    copy, matmul = bench.copy_ceiling_gbps(), bench.matmul_ceiling_tflops()
    rows = bench.run_parts({p: lambda rows, p=p: globals()[f"{p}_rows"](s, rows) for p in parts},
                           desc="w40 advanced fusion", rows=rows)
    table = pd.DataFrame(rows)
    for column in ["pass", "B", "H", "N", "d", "mask", "M", "K", "C", "F", "density", "TFLOP/s", "call_TFLOP/s",
                   "GB/s", "call_GB/s"]:
        if column not in table:
            table[column] = math.nan
    table["note"] = table["note"].fillna("") if "note" in table else ""
    table = pd.concat([bench.speedups(table[table["part"] == part].copy(), ["part", "dtype"] + KEYS.get(part, []))
                       for part in table["part"].unique()], ignore_index=True)
    flash = table[table["kernel"] == "flash_forward (course, causal)"].set_index("N")["ms"]
    table["vs_flash"] = [round(flash.get(r["N"], math.nan) / r["ms"], 2) if r["part"] == "linear" else math.nan
                         for _, r in table.iterrows()]
    table["copy_ceiling_GB/s"], table["matmul_ceiling_TFLOP/s"] = round(copy, 1), round(matmul, 1)
    table["vs_matmul"] = (table["TFLOP/s"] / matmul).round(3)
    table["vs_copy"] = (table["GB/s"] / copy).round(3)
    return table.round({"ms": 4, "call_ms": 4, "host_us": 1, "GB/s": 1, "call_GB/s": 1, "TFLOP/s": 1,
                        "call_TFLOP/s": 1, "speedup": 2, "call_speedup": 2})
