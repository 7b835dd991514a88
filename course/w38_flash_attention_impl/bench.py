"""Week 38 benchmark, one run, bf16. Parts (each row: part, kernel, peer, mask, pass, shape, ms, call_ms, host_us,
TFLOP/s, call_TFLOP/s; `ms` is the kernel alone, `call_ms` the time per call a user sees (course/bench.py `timed`);
`speedup` is the peer's ms over the row's, same part, pass, mask and shape, `call_speedup` the same per call;
`note` says why a row has no time: a shape that does not fit in memory, a peer that fails; the run goes on):
- backward: the course's Triton forward + backward (`flash_attn`) against SDPA's FlashAttention-2, cuDNN and
  memory-efficient backends (and FlexAttention at N = 4096, d = 128), B·N = 16384 tokens, H·d = 2048,
  d ∈ {64, 128}, N = 512 … 16384, causal and not. Forward FLOPs 4·B·H·N²·d (halved causal), backward 2.5× that;
  forward+backward is the sum of the two measured times, 3.5× the forward's FLOPs;
- fa2_steps: the forward with FlashAttention-2's improvements switched on one at a time (N = 4096);
- gqa: forward+backward with H = 32 query heads sharing Hkv ∈ {8, 4} heads, against SDPA with enable_gqa;
- varlen: a packed batch of random lengths against FlashAttention-2 on the padded batch and FlexAttention's
  document mask (TFLOP/s on the real tokens);
- decode: one query token against a KV cache, split-K against one split and SDPA (GB/s and call_GB/s: K and V read
  once), the kernels alone (`ms`, also as `kernel_ms`) and per call (`call_ms`);
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
GQA_SIZES, TC_SIZES = (1024, 4096, 16384), (1024, 4096)
DECODE_BATCHES, DECODE_SIZES = (1, 8, 64), (1024, 8192, 32768, 131072)
DEVICE = "cuda"


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
        mask = create_block_mask(keep, None, None, n, n, device=DEVICE)
    except Exception as exc:  # noqa: BLE001 - recorded on the peer's rows by bench.timed
        reason = f"block mask: {bench.reason(exc)}"

        def failed(*_):
            raise RuntimeError(reason)
        return failed
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v, _causal: compiled(q, k, v, block_mask=mask)


def _row(part, kernel, peer, mask, pass_, times, flops, **shape):
    return {"part": part, "kernel": kernel, "peer": peer, "mask": mask, "pass": pass_, **shape,
            **bench.with_rates(times, flops)}


def _fwd_bwd_rows(rows, part, name, fn, q, k, v, causal, flops, peer, **shape):
    """Forward, backward (autograd from a retained graph) and their sum, for one kernel on one shape."""
    import torch
    fwd = bench.timed(lambda: fn(q, k, v, causal))
    if math.isnan(fwd["ms"]) and math.isnan(fwd["call_ms"]):
        bwd = bench.missed(fwd["note"])  # the forward does not run: neither can the backward
    else:
        try:
            o = fn(q, k, v, causal)
            do = torch.randn_like(o)
            bwd = bench.timed(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
            del o, do
        except Exception as exc:  # noqa: BLE001 - out of memory, or a failure outside the timed calls
            bwd = bench.missed(bench.reason(exc))
        torch.cuda.empty_cache()
    both = {key: fwd[key] + bwd[key] for key in ("ms", "call_ms", "host_us")}
    both["note"] = "; ".join(dict.fromkeys(filter(None, (fwd["note"], bwd["note"]))))
    mask = "causal" if causal else "none"
    for pass_, times, share in (("forward", fwd, 1), ("backward", bwd, BACKWARD_FLOPS),
                                ("forward+backward", both, 1 + BACKWARD_FLOPS)):
        rows.append(_row(part, name, peer, mask, pass_, times, share * flops, **shape))


def _missed_rows(rows, part, names, peer, causal, why, **shape):
    """NaN rows of each pass, with the reason, for a shape that does not fit."""
    for name in names:
        for pass_ in ("forward", "backward", "forward+backward"):
            rows.append(_row(part, name, peer, "causal" if causal else "none", pass_, bench.missed(why), 0, **shape))


def _heads(b, h, n, d, hkv=None):
    import torch
    make = lambda heads: torch.randn(b, heads, n, d, device=DEVICE, dtype=torch.bfloat16,  # noqa: E731
                                     requires_grad=True)
    return make(h), make(hkv or h), make(hkv or h)


def _fits_heads(b, h, n, d, hkv=None):
    """"" where q, k, v, their gradients, the output and its gradient fit (and as much again), else why not."""
    return bench.fits(2 * 2 * b * n * d * (4 * h + 4 * (hkv or h)))


def backward_rows(s38, rows=None):
    import torch
    from torch.nn.attention import SDPBackend
    kernels = {"flash_attn": lambda q, k, v, causal: s38.flash_attn(q, k, v, causal),
               FA2: _sdpa(SDPBackend.FLASH_ATTENTION), "SDPA cuDNN": _sdpa(SDPBackend.CUDNN_ATTENTION),
               "SDPA efficient": _sdpa(SDPBackend.EFFICIENT_ATTENTION)}
    rows = bench.Rows() if rows is None else rows
    for d in HEAD_DIMS:
        for n in SIZES:
            b, h = TOKENS // n, WIDTH // d
            shape = {"B": b, "H": h, "Hkv": h, "N": n, "d": d}
            why = _fits_heads(b, h, n, d)
            q, k, v = (None,) * 3 if why else _heads(b, h, n, d)
            for causal in (False, True):
                extra = ["FlexAttention"] if (n, d) == (STEP_N, 128) else []
                if why:
                    _missed_rows(rows, "backward", list(kernels) + extra, FA2, causal, why, **shape)
                    continue
                fns = {**kernels, **{name: _flex(n, causal) for name in extra}}
                for name, fn in fns.items():
                    _fwd_bwd_rows(rows, "backward", name, fn, q, k, v, causal,
                                  cost.attention_flops(b * h, n, n, d, causal), FA2, **shape)
            del q, k, v
            torch.cuda.empty_cache()
    return rows


STEPS = [("1 one program per head (FA-1 grid)", {"seq_parallel": False, "defer_norm": False, "exp2": False}),
         ("2 + a program per query block", {"defer_norm": False, "exp2": False}),
         ("3 + deferred 1/l", {"exp2": False}), ("4 + exp2, scale folded", {})]
STEP_TILES = (128, 64, 8, 3)  # steps 1-4 share one launch; step 5 lets the autotuner pick


def fa2_steps_rows(s38, rows=None):
    import torch
    from torch.nn.attention import SDPBackend
    rows = bench.Rows() if rows is None else rows
    for d in HEAD_DIMS:
        b, h = TOKENS // STEP_N, WIDTH // d
        shape = {"B": b, "H": h, "Hkv": h, "N": STEP_N, "d": d}
        why = _fits_heads(b, h, STEP_N, d)
        q, k, v = (None,) * 3 if why else (t.detach() for t in _heads(b, h, STEP_N, d))
        for causal in (False, True):
            flops = cost.attention_flops(b * h, STEP_N, STEP_N, d, causal)
            runs = [(name, lambda kw=kw: s38.flash_forward(q, k, v, causal, tiles=STEP_TILES, **kw))
                    for name, kw in STEPS]
            runs += [("5 + autotuned tiles and warps", lambda: s38.flash_forward(q, k, v, causal)),
                     (FA2, lambda: _sdpa(SDPBackend.FLASH_ATTENTION)(q, k, v, causal))]
            for name, fn in runs:
                times = bench.missed(why) if why else bench.timed(fn)
                rows.append(_row("fa2_steps", name, FA2, "causal" if causal else "none", "forward", times, flops,
                                 **shape))
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def gqa_rows(s38, rows=None):
    import torch
    rows, heads, d = bench.Rows() if rows is None else rows, 32, 128
    sdpa = lambda q, k, v, causal: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q, k, v, is_causal=causal, enable_gqa=True)
    kernels = {"flash_attn": lambda q, k, v, c: s38.flash_attn(q, k, v, c), "SDPA (enable_gqa)": sdpa}
    for hkv in (8, 4):
        for n in GQA_SIZES:
            b = TOKENS // n
            shape = {"B": b, "H": heads, "Hkv": hkv, "N": n, "d": d}
            why = _fits_heads(b, heads, n, d, hkv)
            if why:
                _missed_rows(rows, "gqa", kernels, "SDPA (enable_gqa)", True, why, **shape)
                continue
            q, k, v = _heads(b, heads, n, d, hkv)
            for name, fn in kernels.items():
                _fwd_bwd_rows(rows, "gqa", name, fn, q, k, v, True, cost.attention_flops(b * heads, n, n, d, True),
                              "SDPA (enable_gqa)", **shape)
            del q, k, v
            torch.cuda.empty_cache()
    return rows


def varlen_rows(s38, rows=None):
    import torch
    from torch.nn.attention import SDPBackend
    rows = bench.Rows() if rows is None else rows
    rng = np.random.default_rng(0)
    lengths = []
    while sum(lengths) < TOKENS:
        lengths.append(int(min(rng.integers(128, 4097), TOKENS - sum(lengths))))
    heads, d, longest = 16, 128, max(lengths)
    flops = sum(cost.attention_flops(heads, n, n, d, True) for n in lengths)
    shape = {"B": len(lengths), "H": heads, "Hkv": heads, "N": TOKENS, "d": d}
    names = ("flash_attn_varlen", FA2 + " (padded)", "FlexAttention (document mask)")
    why = _fits_heads(len(lengths), heads, longest, d) or _fits_heads(2, heads, TOKENS, d)  # padded; packed and flat
    if why:
        _missed_rows(rows, "varlen", names, FA2 + " (padded)", True, why, **shape)
        return rows
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=DEVICE)
    packed = [torch.randn(TOKENS, heads, d, device=DEVICE, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    _fwd_bwd_rows(rows, "varlen", names[0], lambda q, k, v, c: s38.flash_attn_varlen(q, k, v, cu, c), *packed, True,
                  flops, FA2 + " (padded)", **shape)
    padded = _heads(len(lengths), heads, longest, d)  # what padding to the longest costs (its output is not used)
    _fwd_bwd_rows(rows, "varlen", names[1], _sdpa(SDPBackend.FLASH_ATTENTION), *padded, True, flops,
                  FA2 + " (padded)", **shape)
    del padded
    documents = torch.repeat_interleave(torch.arange(len(lengths), device=DEVICE),
                                        torch.tensor(lengths, device=DEVICE))
    flat = [t.detach().transpose(0, 1)[None].contiguous().requires_grad_() for t in packed]  # (1, H, T, d)
    _fwd_bwd_rows(rows, "varlen", names[2], _flex(TOKENS, True, documents), *flat, True, flops, FA2 + " (padded)",
                  **shape)
    return rows


def decode_rows(s38, rows=None):
    """`ms` the kernels alone (CUDA-graph replay), `call_ms` per call: a decode step is short enough for the host's
    work per call to matter. `kernel_ms` repeats `ms` under the name the recorded results and notebooks use."""
    import torch
    rows, heads, kv_heads, d = bench.Rows() if rows is None else rows, 32, 8, 128
    names = ("flash_decode (split-K)", "flash_decode (one split)", "SDPA")
    for b in DECODE_BATCHES:
        for n in DECODE_SIZES:
            kv_bytes = 2 * b * kv_heads * n * d * 2
            why = bench.fits(2 * kv_bytes)  # K and V, and as much again
            q = k = v = None  # allocated only where they fit
            if not why:
                q = torch.randn(b, heads, 1, d, device=DEVICE, dtype=torch.bfloat16)
                k, v = (torch.randn(b, kv_heads, n, d, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
            fns = (lambda: s38.flash_decode(q, k, v), lambda: s38.flash_decode(q, k, v, splits=1),
                   lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True))
            for name, fn in zip(names, fns):
                times = bench.missed(why) if why else bench.timed(fn)
                row = _row("decode", name, "flash_decode (one split)", "none", "forward", times,
                           cost.attention_flops(b * heads, 1, n, d), B=b, H=heads, Hkv=kv_heads, N=n, d=d)
                rows.append({**row, **bench.with_rates(times, nbytes=kv_bytes), "kernel_ms": times["ms"]})
            del q, k, v, fns
            torch.cuda.empty_cache()
    return rows


def tensor_cores_rows(s38, rows=None):
    import torch
    from torch.nn.attention import SDPBackend

    from ..registry import kernels
    s37 = kernels("w37_flash_attention_core")
    rows = bench.Rows() if rows is None else rows
    fns = {"tc_flash_attention": s38.tc_flash_attention, "cuda_flash_attention (week 37)": s37.cuda_flash_attention,
           "flash_attn": lambda q, k, v, causal: s38.flash_forward(q, k, v, causal),
           FA2: _sdpa(SDPBackend.FLASH_ATTENTION)}
    for d in HEAD_DIMS:
        for n in TC_SIZES:
            b, h = TOKENS // n, WIDTH // d
            why = _fits_heads(b, h, n, d)
            q, k, v = (None,) * 3 if why else (t.detach() for t in _heads(b, h, n, d))
            for causal in (False, True):
                for name, fn in fns.items():
                    times = bench.missed(why) if why else bench.timed(lambda: fn(q, k, v, causal=causal))
                    rows.append(_row("tensor_cores", name, FA2, "causal" if causal else "none", "forward", times,
                                     cost.attention_flops(b * h, n, n, d, causal), B=b, H=h, Hkv=h, N=n, d=d))
            del q, k, v
            torch.cuda.empty_cache()
    return rows


def train_rows(s38, rows=None):
    from . import train
    attend = lambda q, k, v: s38.flash_attn(q, k, v, causal=True)  # noqa: E731
    rows = bench.Rows() if rows is None else rows
    config = train.GPU_CONFIG
    shape = {"part": "train", "peer": "SDPA", "mask": "causal", "pass": "forward+backward", "B": train.GPU_RUN["batch"],
             "H": config.heads, "Hkv": config.kv_heads, "N": config.context, "d": config.head_dim}
    for name, fn in (("flash_attn", attend), ("SDPA", train.sdpa_attention)):
        try:
            history = train.train(fn, config, train.GPU_STEPS, seed=0, log_grads=False, **train.GPU_RUN)
        except Exception as exc:  # noqa: BLE001 - the other attention's run is still worth recording
            rows.append({**shape, "kernel": name, "note": bench.reason(exc)})
            continue
        for step, loss in enumerate(history.loss):
            rows.append({**shape, "kernel": name, "step": step, "loss": loss})
    return rows


PARTS = ("backward", "fa2_steps", "gqa", "varlen", "decode", "tensor_cores", "train")


def run(parts=PARTS, rows=None) -> pd.DataFrame:
    from ..registry import kernels
    s38 = kernels("w38_flash_attention_impl")
    matmul, copy = bench.matmul_ceiling_tflops(), bench.copy_ceiling_gbps()
    rows = bench.run_parts({p: lambda rows, p=p: globals()[f"{p}_rows"](s38, rows) for p in parts},
                           desc="w38 FlashAttention implementation", rows=rows)
    table = pd.DataFrame(rows)
    table.insert(0, "dtype", "bfloat16")
    for column in ("peer", "pass", "mask", "B", "Hkv", "N", "d", "ms", "call_ms", "kernel_ms", "TFLOP/s", "GB/s",
                   "step", "loss"):
        if column not in table:  # a run of some parts may have none of a column
            table[column] = math.nan
    table["note"] = table["note"].fillna("") if "note" in table else ""
    table = bench.speedups(table, ["part", "pass", "mask", "B", "Hkv", "N", "d"])
    table["vs_matmul"] = table["TFLOP/s"] / matmul
    table["matmul_ceiling_TFLOP/s"] = matmul
    table["copy_ceiling_GB/s"] = copy
    return table.round({"ms": 4, "call_ms": 4, "host_us": 1, "kernel_ms": 4, "TFLOP/s": 1, "call_TFLOP/s": 1,
                        "GB/s": 1, "call_GB/s": 1, "speedup": 2, "call_speedup": 2, "vs_matmul": 3,
                        "matmul_ceiling_TFLOP/s": 1, "copy_ceiling_GB/s": 1, "loss": 4})
