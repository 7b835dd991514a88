"""Week 35 benchmark, one run, bf16, B·H = 64 (B = 4, H = 16), M = N:
- qk: TFLOP/s of the Triton QKᵀ kernel (and the CUDA C tiled one) vs torch.matmul and the bf16 matmul ceiling;
- softmax: GB/s of the fused scale + mask + softmax (Triton, CUDA C) vs torch eager (scale, masked_fill,
  softmax) and the copy ceiling, no mask and causal;
- attention: time and peak extra memory of the composed attention vs torch's matmul-softmax-matmul,
  SDPA's math backend and SDPA's default (FlashAttention) for perspective.
Two times per row (course/bench.py `timed`): `ms` the kernel alone, `call_ms` per call as a user sees it, and the rates
of each (`TFLOP/s`, `GB/s`; `call_TFLOP/s`, `call_GB/s`). `speedup` is the peer's ms over this row's (`call_speedup`:
the same per call), both from this run. A size or peer that does not fit, or fails, has NaN and the reason in `note`.
FLOPs and bytes come from reference.py's cost model.

`tune_qk`, `tune_pv` and `tune_softmax` are the sweeps that chose the kernels' launch settings (QK_TILE, PV_TILE, the
fused softmax's warps per row): not part of run(), each returns a table, one row per setting."""
import contextlib
import math

import pandas as pd

from .. import bench
from ..attention_cost import pv_cost
from . import reference as ref

B, H = 4, 16
DEVICE = "cuda"
QK_SIZES = [(n, d) for n in (1024, 4096) for d in (64, 128)]
SOFTMAX_SIZES = (1024, 2048, 4096)
MASKS = ("none", "causal")
# bytes per (query, key) pair each attention peer holds at its peak, with a margin: the composed attention a float32
# S, the eager chain two bf16 squares, SDPA's math backend float32 scores and probabilities, SDPA's default none
PAIR_BYTES = {"attention": 8, "torch matmul-softmax-matmul": 8, "SDPA math": 12, "SDPA default": 0}


def _causal_keep(n, device):
    import torch
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def _randn(*shape, dtype="bfloat16"):
    import torch
    return torch.randn(*shape, device=DEVICE, dtype=getattr(torch, dtype))


def qk_rows(s, rows=None):
    import torch
    rows = bench.Rows() if rows is None else rows
    for n, d in QK_SIZES:
        cost = ref.qk_cost(B * H, n, n, d, 2)
        why = bench.fits(2 * cost["bytes"])  # q, k, the scores, and as much again
        q = k = out = None  # allocated only where they fit
        if not why:
            q, k = _randn(B, H, n, d), _randn(B, H, n, d)
            out = torch.empty(B, H, n, n, device=DEVICE, dtype=torch.bfloat16)
        fns = {"qk_scores": lambda: s.qk_scores(q, k, out=out),
               "torch.matmul": lambda: torch.matmul(q, k.transpose(-1, -2), out=out)}
        if n == 1024:
            fns["tiled_matmul"] = lambda: s.tiled_matmul(q, k, out=out)
        for name, fn in fns.items():
            times = bench.missed(why) if why else bench.timed(fn)
            rows.append({"part": "qk", "kernel": name, "peer": "torch.matmul", "mask": "none", "N": n, "d": d,
                         **bench.with_rates(times, cost["flops"], cost["bytes"])})
        del q, k, out, fns
        torch.cuda.empty_cache()
    return rows


def softmax_rows(s, rows=None):
    import torch
    rows = bench.Rows() if rows is None else rows
    for n in SOFTMAX_SIZES:
        square = B * H * n * n * 2
        why = bench.fits(6 * square + n * n)  # scores, out, eager's three temporaries, a margin; the mask
        scores = out = keep = None  # allocated only where they fit
        if not why:
            scores, keep = _randn(B, H, n, n), _causal_keep(n, DEVICE)
            out = torch.empty_like(scores)
        scale = 1 / math.sqrt(128)
        for mask in MASKS:
            causal = mask == "causal"
            eager = (lambda: torch.softmax((scores * scale).masked_fill(~keep, float("-inf")), dim=-1)) if causal \
                else (lambda: torch.softmax(scores * scale, dim=-1))
            fns = {"scale_mask_softmax": lambda: s.scale_mask_softmax(scores, out, scale, causal=causal),
                   "cuda_scale_mask_softmax": lambda: s.cuda_scale_mask_softmax(scores, out, scale, causal=causal),
                   "torch eager": eager, "copy": bench.copier(scores, out)}
            cost = ref.softmax_cost(B * H, n, n, 2, causal)
            for name, fn in fns.items():
                times = bench.missed(why) if why else bench.timed(fn)
                rows.append({"part": "softmax", "kernel": name, "peer": "torch eager", "mask": mask, "N": n, "d": 128,
                             **bench.with_rates(times, nbytes=2 * square if name == "copy" else cost["bytes"])})
        del scores, out, keep, fns
        torch.cuda.empty_cache()
    return rows


def attention_rows(s, rows=None):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    rows = bench.Rows() if rows is None else rows

    def sdpa_math(q, k, v, causal):
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    for n, d in QK_SIZES:
        why = bench.fits(4 * B * H * n * d * 2 + n * n)  # q, k, v, the output; the mask
        q = k = v = keep = None  # allocated only where they fit
        if not why:
            q, k, v = (_randn(B, H, n, d) for _ in range(3))
            keep = _causal_keep(n, DEVICE)
        scale = 1 / math.sqrt(d)
        for mask in MASKS:
            causal = mask == "causal"

            def eager():
                scores = torch.matmul(q, k.transpose(-1, -2)) * scale
                if causal:
                    scores = scores.masked_fill(~keep, float("-inf"))
                return torch.matmul(torch.softmax(scores, dim=-1), v)
            fns = {"attention": lambda: s.attention(q, k, v, causal=causal),
                   "torch matmul-softmax-matmul": eager,
                   "SDPA math": lambda: sdpa_math(q, k, v, causal),
                   "SDPA default": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)}
            flops = ref.attention_flops(B * H, n, n, d) // (2 if causal else 1)
            for name, fn in fns.items():
                skip = why or bench.fits(PAIR_BYTES[name] * B * H * n * n)
                times = {**bench.missed(skip), "peak_MB": math.nan} if skip else bench.timed_peak(fn)
                rows.append({"part": "attention", "kernel": name, "peer": "torch matmul-softmax-matmul",
                             "mask": mask, "N": n, "d": d, **bench.with_rates(times, flops)})
        del q, k, v, keep, fns, eager
        torch.cuda.empty_cache()
    return rows


PARTS = ("qk", "softmax", "attention")


def run(parts=PARTS, rows=None) -> pd.DataFrame:
    from ..registry import kernels
    s = kernels("w35_attention_blocks")
    copy, matmul = bench.copy_ceiling_gbps(), bench.matmul_ceiling_tflops()
    rows = bench.run_parts({p: lambda rows, p=p: globals()[f"{p}_rows"](s, rows) for p in parts},
                           desc="w35 attention blocks", rows=rows)
    table = pd.DataFrame(rows)
    table.insert(0, "dtype", "bfloat16")
    table.insert(1, "B", B)
    table.insert(2, "H", H)
    for column in ("ms", "call_ms", "TFLOP/s", "GB/s", "peak_MB"):  # a run of some parts may have none of a column
        if column not in table:
            table[column] = math.nan
    table = bench.speedups(table, ["part", "mask", "N", "d"])
    table["vs_copy"] = table["GB/s"] / copy
    table["vs_matmul"] = table["TFLOP/s"] / matmul
    table["copy_ceiling_GB/s"], table["matmul_ceiling_TFLOP/s"] = copy, matmul
    return table.round({"ms": 4, "call_ms": 4, "host_us": 1, "TFLOP/s": 1, "call_TFLOP/s": 1, "GB/s": 1,
                        "call_GB/s": 1, "peak_MB": 1, "speedup": 2, "call_speedup": 2, "vs_copy": 3, "vs_matmul": 3,
                        "copy_ceiling_GB/s": 1, "matmul_ceiling_TFLOP/s": 1})


# ---------------------------------------------------------------- sweeps of the launch settings (not part of run())
TUNE_SIZES = ((4096, 128), (4096, 64), (1024, 128))  # (N, d)
# (BLOCK_M, BLOCK_N, TILES, STAGES, num_warps); the first: one tile per program
QK_TILES = [(128, 128, 1, 1, 8), (128, 128, 16, 3, 8), (128, 64, 16, 3, 8), (128, 64, 16, 3, 4), (128, 64, 8, 3, 8),
            (128, 64, 32, 3, 8), (128, 64, 16, 2, 8), (128, 64, 16, 4, 8), (64, 64, 16, 3, 4), (64, 128, 16, 3, 4),
            (256, 64, 16, 3, 8), (128, 32, 16, 3, 4)]
# (BLOCK_M, BLOCK_N, num_warps, num_stages)
PV_TILES = [(128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3), (64, 128, 4, 3), (128, 64, 8, 4),
            (256, 64, 8, 3), (128, 32, 4, 4)]
SOFTMAX_WARPS = (1, 2, 4, 8, 16)


@contextlib.contextmanager
def _setting(module, name, value):
    """The launcher's module-level setting `name` (QK_TILE, PV_TILE) set to `value` for the block."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def _checked(fn, want) -> dict:
    """fn() (which returns its output) checked against `want`, then timed: {ms, max_abs_error, note}; a setting that
    does not compile or fails has NaN and the reason."""
    try:
        error = (fn().float() - want).abs().max().item()
    except Exception as exc:  # noqa: BLE001 - too much shared memory, a shape the compiler rejects: recorded
        return {"ms": math.nan, "max_abs_error": math.nan, "note": bench.reason(exc)}
    ms, why = bench.attempt_ms(fn)
    return {"ms": ms, "max_abs_error": error, "note": why}


def _tile_rows(s, setting: str, tiles, call, want, flops: float, peer_ms: float, n: int, d: int) -> list:
    """One row per tile: call() checked against want and timed with the module's `setting` set to the tile."""
    rows = []
    for tile in tiles:
        with _setting(s, setting, tile):
            row = _checked(call, want)
        rows.append({"N": n, "d": d, "tile": tile, "current": tile == getattr(s, setting), **row,
                     "TFLOP/s": flops / row["ms"] / 1e9, "vs_torch": peer_ms / row["ms"]})
    return rows


def tune_qk(sizes=TUNE_SIZES, tiles=QK_TILES, dtype="bfloat16") -> pd.DataFrame:
    """qk_scores at each tile (BLOCK_M, BLOCK_N, TILES, STAGES, num_warps) against torch.matmul timed on the
    same inputs: TFLOP/s and `vs_torch`; `current` marks QK_TILE."""
    import torch
    from ..registry import kernels
    s = kernels("w35_attention_blocks")
    rows = []
    for n, d in sizes:
        q, k = _randn(B, H, n, d, dtype=dtype), _randn(B, H, n, d, dtype=dtype)
        out = torch.empty(B, H, n, n, device=DEVICE, dtype=q.dtype)
        want = torch.matmul(q, k.transpose(-1, -2)).float()
        flops = ref.qk_cost(B * H, n, n, d, q.element_size())["flops"]
        peer = bench.gpu_ms(lambda: torch.matmul(q, k.transpose(-1, -2), out=out))
        rows += _tile_rows(s, "QK_TILE", tiles, lambda: s.qk_scores(q, k, out=out), want, flops, peer, n, d)
        del q, k, out, want
        torch.cuda.empty_cache()
    return pd.DataFrame(rows).round({"ms": 4, "TFLOP/s": 1, "vs_torch": 3})


def tune_pv(sizes=TUNE_SIZES, tiles=PV_TILES, dtype="bfloat16") -> pd.DataFrame:
    """pv at each tile (BLOCK_M, BLOCK_N, num_warps, num_stages), no mask, against torch.matmul
    timed on the same inputs; `current` marks PV_TILE."""
    import torch
    from ..registry import kernels
    s = kernels("w35_attention_blocks")
    rows = []
    for n, d in sizes:
        p = torch.softmax(_randn(B, H, n, n, dtype=dtype), dim=-1)
        v = _randn(B, H, n, d, dtype=dtype)
        out = torch.empty(B, H, n, d, device=DEVICE, dtype=v.dtype)
        want = torch.matmul(p.float(), v.float())
        flops = pv_cost(B * H, n, n, d, v.element_size())["flops"]
        peer = bench.gpu_ms(lambda: torch.matmul(p, v, out=out))
        rows += _tile_rows(s, "PV_TILE", tiles, lambda: s.pv(p, v, out=out), want, flops, peer, n, d)
        del p, v, out, want
        torch.cuda.empty_cache()
    return pd.DataFrame(rows).round({"ms": 4, "TFLOP/s": 1, "vs_torch": 3})


def tune_softmax(sizes=SOFTMAX_SIZES, warps=SOFTMAX_WARPS, masks=MASKS, dtype="bfloat16") -> pd.DataFrame:
    """The fused scale + mask + softmax kernel at each num_warps (scores and probabilities in `dtype`), no mask and causal:
    GB/s on the bytes it must move and `vs_copy`; the row `launcher` is scale_mask_softmax with its own choice."""
    import torch
    import triton
    from ..registry import kernels
    s = kernels("w35_attention_blocks")
    copy = bench.copy_ceiling_gbps()
    scale = 1 / math.sqrt(128)
    rows = []
    for n in sizes:
        scores = 3 * _randn(B, H, n, n, dtype=dtype)
        out = torch.empty_like(scores)
        keep = _causal_keep(n, DEVICE)
        for mask in masks:
            causal = mask == "causal"
            x = scores.float() * scale
            want = torch.softmax(x.masked_fill(~keep, float("-inf")) if causal else x, dim=-1)
            del x
            nbytes = ref.softmax_cost(B * H, n, n, scores.element_size(), causal)["bytes"]

            def kernel(w):
                s.scale_mask_softmax_kernel[(B * H * n,)](
                    scores, out, scores, scores, n, n, H, scale, *scores.stride()[:3], out.stride(2),
                    BLOCK_N=max(32, triton.next_power_of_2(n)), CAUSAL=causal, HAS_LENGTHS=False, HAS_ALIBI=False,
                    num_warps=w)
                return out
            runs = {w: (lambda w=w: kernel(w)) for w in warps}
            runs["launcher"] = lambda: s.scale_mask_softmax(scores, out, scale, causal=causal)
            for w, fn in runs.items():
                row = _checked(fn, want)
                rows.append({"N": n, "mask": mask, "warps": w, **row, "GB/s": nbytes / row["ms"] / 1e6,
                             "vs_copy": nbytes / row["ms"] / 1e6 / copy})
            del want
        del scores, out, keep
        torch.cuda.empty_cache()
    return pd.DataFrame(rows).round({"ms": 4, "GB/s": 1, "vs_copy": 3})
