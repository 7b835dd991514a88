"""Week 38 benchmark, one run, bf16. Parts (each row: part, kernel, peer, mask, pass, shape, ms, TFLOP/s; `speedup`
is the peer's ms over the row's, same part, pass, mask and shape; `note` says why a row has no time):
- backward: the course's Triton forward + backward (`flash_attn`) against SDPA's FlashAttention-2, cuDNN and
  memory-efficient backends (and FlexAttention at N = 4096, d = 128), B·N = 16384 tokens, H·d = 2048,
  d ∈ {64, 128}, N = 512 … 16384, causal and not. Forward FLOPs 4·B·H·N²·d (halved causal), backward 2.5× that;
  forward+backward is the sum of the two measured times, 3.5× the forward's FLOPs;
- fa2_steps: the forward with FlashAttention-2's improvements switched on one at a time (N = 4096);
- gqa: forward+backward with H = 32 query heads sharing Hkv ∈ {8, 4} heads, against SDPA with enable_gqa;
- varlen: a packed batch of random lengths against FlashAttention-2 on the padded batch and FlexAttention's
  document mask (TFLOP/s on the real tokens);
- decode: one query token against a KV cache, split-K against one split and SDPA (GB/s: K and V read once), per
  call (`ms`) and with the kernels alone (`kernel_ms`, CUDA-graph replay);
- tensor_cores: the CUDA C tensor-core forward against week 37's float32-arithmetic CUDA kernel, the Triton
  forward and FlashAttention-2;
- train: the tiny transformer's loss per step, the course's attention against SDPA, same seed."""
import math

import numpy as np
import pandas as pd

from .. import attention_cost as cost
from .. import bench

TOKENS, WIDTH = 16384, 2048
SIZES = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
FA2 = "SDPA FlashAttention-2"
BACKWARD_FLOPS, STEP_N = 2.5, 4096


def _sdpa(backend, **kwargs):
    import torch
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, **kwargs)
    return run


def _flex(n, causal, documents=None):
    """FlexAttention compiled for one shape: causal or not, optionally within documents (packed sequences)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    torch._dynamo.reset()  # a fresh compile per shape: past its cache limit, dynamo would fall back to eager

    def keep(b, h, q_idx, kv_idx):
        ok = q_idx >= kv_idx if causal else q_idx >= 0
        return ok & (documents[q_idx] == documents[kv_idx]) if documents is not None else ok
    try:
        mask = create_block_mask(keep, None, None, n, n, device="cuda")
    except Exception as exc:  # noqa: BLE001 - recorded on the peer's rows by attempt_ms
        reason = f"block mask: {type(exc).__name__}: {exc}"

        def failed(*_):
            raise RuntimeError(reason)
        return failed
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v, _causal: compiled(q, k, v, block_mask=mask)


def _row(part, kernel, peer, mask, pass_, ms, flops, note="", **shape):
    return {"part": part, "kernel": kernel, "peer": peer, "mask": mask, "pass": pass_, **shape, "ms": ms,
            "TFLOP/s": flops / ms / 1e9 if ms == ms else math.nan, "note": note}


def _fwd_bwd_rows(part, name, fn, q, k, v, causal, flops, peer, **shape):
    """Forward, backward (autograd from a retained graph) and their sum, for one kernel on one shape."""
    import torch
    mask = "causal" if causal else "none"
    fwd, note = bench.attempt_ms(lambda: fn(q, k, v, causal))
    if note:
        return [_row(part, name, peer, mask, p, math.nan, 0, note, **shape) for p in ("forward", "backward",
                                                                                      "forward+backward")]
    o = fn(q, k, v, causal)
    do = torch.randn_like(o)
    bwd, note = bench.attempt_ms(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    del o
    return [_row(part, name, peer, mask, "forward", fwd, flops, **shape),
            _row(part, name, peer, mask, "backward", bwd, BACKWARD_FLOPS * flops, note, **shape),
            _row(part, name, peer, mask, "forward+backward", fwd + bwd, (1 + BACKWARD_FLOPS) * flops, note, **shape)]


def _heads(b, h, n, d, hkv=None):
    import torch
    make = lambda heads: torch.randn(b, heads, n, d, device="cuda", dtype=torch.bfloat16,  # noqa: E731
                                     requires_grad=True)
    return make(h), make(hkv or h), make(hkv or h)


def backward_rows(s38):
    from torch.nn.attention import SDPBackend
    kernels = {"flash_attn": lambda q, k, v, causal: s38.flash_attn(q, k, v, causal), FA2: _sdpa(SDPBackend.FLASH_ATTENTION),
               "SDPA cuDNN": _sdpa(SDPBackend.CUDNN_ATTENTION), "SDPA efficient": _sdpa(SDPBackend.EFFICIENT_ATTENTION)}
    rows = []
    for d in HEAD_DIMS:
        for n in SIZES:
            b, h = TOKENS // n, WIDTH // d
            q, k, v = _heads(b, h, n, d)
            for causal in (False, True):
                extra = {"FlexAttention": _flex(n, causal)} if (n, d) == (STEP_N, 128) else {}
                for name, fn in {**kernels, **extra}.items():
                    rows += _fwd_bwd_rows("backward", name, fn, q, k, v, causal, cost.attention_flops(b * h, n, n, d, causal),
                                          FA2, B=b, H=h, Hkv=h, N=n, d=d)
    return rows


STEPS = [("1 one program per head (FA-1 grid)", {"seq_parallel": False, "defer_norm": False, "exp2": False}),
         ("2 + a program per query block", {"defer_norm": False, "exp2": False}),
         ("3 + deferred 1/l", {"exp2": False}), ("4 + exp2, scale folded", {})]
STEP_TILES = (128, 64, 8, 3)  # steps 1-4 share one launch; step 5 lets the autotuner pick


def fa2_steps_rows(s38):
    import torch
    from torch.nn.attention import SDPBackend
    rows = []
    for d in HEAD_DIMS:
        b, h = TOKENS // STEP_N, WIDTH // d
        q, k, v = (t.detach() for t in _heads(b, h, STEP_N, d))
        for causal in (False, True):
            flops = cost.attention_flops(b * h, STEP_N, STEP_N, d, causal)
            runs = [(name, lambda kw=kw: s38.flash_forward(q, k, v, causal, tiles=STEP_TILES, **kw)) for name, kw in STEPS]
            runs += [("5 + autotuned tiles and warps", lambda: s38.flash_forward(q, k, v, causal)),
                     (FA2, lambda: _sdpa(SDPBackend.FLASH_ATTENTION)(q, k, v, causal))]
            for name, fn in runs:
                ms, note = bench.attempt_ms(fn)
                rows.append(_row("fa2_steps", name, FA2, "causal" if causal else "none", "forward", ms, flops, note,
                                 B=b, H=h, Hkv=h, N=STEP_N, d=d))
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def gqa_rows(s38):
    rows, heads, d = [], 32, 128
    sdpa = lambda q, k, v, causal: __import__("torch").nn.functional.scaled_dot_product_attention(  # noqa: E731
        q, k, v, is_causal=causal, enable_gqa=True)
    for hkv in (8, 4):
        for n in (1024, 4096, 16384):
            b = TOKENS // n
            q, k, v = _heads(b, heads, n, d, hkv)
            for name, fn in (("flash_attn", lambda q, k, v, c: s38.flash_attn(q, k, v, c)), ("SDPA (enable_gqa)", sdpa)):
                rows += _fwd_bwd_rows("gqa", name, fn, q, k, v, True, cost.attention_flops(b * heads, n, n, d, True),
                                      "SDPA (enable_gqa)", B=b, H=heads, Hkv=hkv, N=n, d=d)
    return rows


def varlen_rows(s38):
    import torch
    from torch.nn.attention import SDPBackend
    rng = np.random.default_rng(0)
    lengths = []
    while sum(lengths) < TOKENS:
        lengths.append(int(min(rng.integers(128, 4097), TOKENS - sum(lengths))))
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device="cuda")
    heads, d, longest = 16, 128, max(lengths)
    flops = sum(cost.attention_flops(heads, n, n, d, True) for n in lengths)
    shape = {"B": len(lengths), "H": heads, "Hkv": heads, "N": TOKENS, "d": d}
    packed = [torch.randn(TOKENS, heads, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    rows = _fwd_bwd_rows("varlen", "flash_attn_varlen", lambda q, k, v, c: s38.flash_attn_varlen(q, k, v, cu, c),
                         *packed, True, flops, FA2 + " (padded)", **shape)
    padded = _heads(len(lengths), heads, longest, d)  # what padding to the longest costs (its output is not used)
    rows += _fwd_bwd_rows("varlen", FA2 + " (padded)", _sdpa(SDPBackend.FLASH_ATTENTION), *padded, True, flops,
                          FA2 + " (padded)", **shape)
    documents = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"), torch.tensor(lengths, device="cuda"))
    flat = [t.detach().transpose(0, 1)[None].contiguous().requires_grad_() for t in packed]  # (1, H, T, d)
    rows += _fwd_bwd_rows("varlen", "FlexAttention (document mask)", _flex(TOKENS, True, documents), *flat, True, flops,
                          FA2 + " (padded)", **shape)
    return rows


def _graph_ms(fn) -> float:
    """The kernels alone: CUDA-graph replay, no host work between them (a decode step is short enough for the
    per-call host time to matter; `ms` is the time a caller sees)."""
    import triton
    try:
        return triton.testing.do_bench_cudagraph(fn)
    except Exception:  # noqa: BLE001 - a kernel that cannot be captured keeps its per-call time only
        return math.nan


def decode_rows(s38):
    import torch
    rows, heads, kv_heads, d = [], 32, 8, 128
    for b in (1, 8, 64):
        for n in (1024, 8192, 32768, 131072):
            try:
                q = torch.randn(b, heads, 1, d, device="cuda", dtype=torch.bfloat16)
                k, v = (torch.randn(b, kv_heads, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                continue
            kv_bytes = 2 * b * kv_heads * n * d * 2
            for name, fn in (("flash_decode (split-K)", lambda: s38.flash_decode(q, k, v)),
                             ("flash_decode (one split)", lambda: s38.flash_decode(q, k, v, splits=1)),
                             ("SDPA", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True))):
                ms, note = bench.attempt_ms(fn)
                row = _row("decode", name, "flash_decode (one split)", "none", "forward", ms,
                           cost.attention_flops(b * heads, 1, n, d), note, B=b, H=heads, Hkv=kv_heads, N=n, d=d)
                rows.append({**row, "GB/s": kv_bytes / ms / 1e6 if ms == ms else math.nan,
                             "kernel_ms": _graph_ms(fn) if not note else math.nan})
            del q, k, v
            torch.cuda.empty_cache()
    return rows


def tensor_cores_rows(s38):
    import torch
    from torch.nn.attention import SDPBackend

    from ..registry import kernels
    s37 = kernels("w37_flash_attention_core")
    rows = []
    for d in HEAD_DIMS:
        for n in (1024, 4096):
            b, h = TOKENS // n, WIDTH // d
            q, k, v = (t.detach() for t in _heads(b, h, n, d))
            for causal in (False, True):
                for name, fn in (("tc_flash_attention", s38.tc_flash_attention),
                                 ("cuda_flash_attention (week 37)", s37.cuda_flash_attention),
                                 ("flash_attn", lambda q, k, v, causal: s38.flash_forward(q, k, v, causal)),
                                 (FA2, _sdpa(SDPBackend.FLASH_ATTENTION))):
                    ms, note = bench.attempt_ms(lambda: fn(q, k, v, causal=causal) if name != FA2 else fn(q, k, v, causal))
                    rows.append(_row("tensor_cores", name, FA2, "causal" if causal else "none", "forward", ms,
                                     cost.attention_flops(b * h, n, n, d, causal), note, B=b, H=h, Hkv=h, N=n, d=d))
            del q, k, v
            torch.cuda.empty_cache()
    return rows


def train_rows(s38):
    from . import train
    attend = lambda q, k, v: s38.flash_attn(q, k, v, causal=True)  # noqa: E731
    rows = []
    for name, fn in (("flash_attn", attend), ("SDPA", train.sdpa_attention)):
        history = train.train(fn, train.GPU_CONFIG, train.GPU_STEPS, seed=0, log_grads=False, **train.GPU_RUN)
        config = train.GPU_CONFIG
        rows += [{"part": "train", "kernel": name, "peer": "SDPA", "mask": "causal", "pass": "forward+backward",
                  "B": train.GPU_RUN["batch"], "H": config.heads, "Hkv": config.kv_heads, "N": config.context,
                  "d": config.head_dim, "step": step, "loss": loss} for step, loss in enumerate(history.loss)]
    return rows


PARTS = ("backward", "fa2_steps", "gqa", "varlen", "decode", "tensor_cores", "train")


def run(parts=PARTS) -> pd.DataFrame:
    from tqdm.auto import tqdm  # here, not at import: notebooks import this module without ipywidgets

    from ..registry import kernels
    s38 = kernels("w38_flash_attention_impl")
    matmul, copy = bench.matmul_ceiling_tflops(), bench.copy_ceiling_gbps()
    rows = []
    for part in tqdm(parts, desc="w38 FlashAttention implementation"):
        rows += globals()[f"{part}_rows"](s38)
    table = pd.DataFrame(rows)
    table.insert(0, "dtype", "bfloat16")
    for column in ("ms", "kernel_ms", "TFLOP/s", "GB/s", "step", "loss"):
        if column not in table:
            table[column] = math.nan
    table["note"] = table["note"].fillna("")
    shape = ["part", "pass", "mask", "B", "Hkv", "N", "d"]
    peers = table.dropna(subset=["ms"]).drop_duplicates(shape + ["kernel"])[shape + ["kernel", "ms"]]
    table = table.merge(peers.rename(columns={"kernel": "peer", "ms": "peer_ms"}), on=shape + ["peer"], how="left")
    table["speedup"] = table.pop("peer_ms") / table["ms"]
    table["vs_matmul"] = table["TFLOP/s"] / matmul
    table["matmul_ceiling_TFLOP/s"] = matmul
    table["copy_ceiling_GB/s"] = copy
    return table.round({"ms": 4, "kernel_ms": 4, "TFLOP/s": 1, "GB/s": 1, "speedup": 2, "vs_matmul": 3, "matmul_ceiling_TFLOP/s": 1,
                        "copy_ceiling_GB/s": 1, "loss": 4})
