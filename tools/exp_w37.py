"""Week-37 experiments, on a GPU from the repository root: python3 tools/exp_w37.py [tiles|cuda ...]
- tiles: the Triton FlashAttention forward's tiles against SDPA's FlashAttention-2 and cuDNN backends, bf16,
  batch·N = 16384 tokens, heads·d = 2048 (the issue's shapes); every config checked before it is timed.
- cuda: the CUDA C forward checked against float64 (odd sizes, causal, three dtypes), then timed in float32 at
  N = 4096 against week 35's composed float32 attention (three kernels, an N × N float32 buffer)."""
import sys

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from course import attention_cost as cost
from course import bench
from solutions import w37_flash_attention_core as s

F = torch.nn.functional
CONFIGS = {64: [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 4, 3), (128, 64, 4, 4)],
           128: [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3), (128, 64, 4, 3)]}


def sdpa(backend, q, k, v, causal):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def cuda():
    from course.w35_attention_blocks import reference as ref
    from solutions import w35_attention_blocks as s35
    for (b, h, m, n, d) in [(1, 1, 1, 1, 16), (2, 3, 37, 37, 64), (1, 2, 130, 200, 64), (1, 2, 70, 45, 100),
                            (2, 2, 300, 300, 128), (1, 1, 64, 64, 32)]:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for causal in (False, True):
                q, k, v = (torch.randn(b, h, r, d, device="cuda", dtype=dtype) for r in (m, n, n))
                o, lse = s.cuda_flash_attention(q, k, v, causal=causal)
                want = ref.attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=causal)
                err = np.abs(o.double().cpu().numpy() - want).max()
                print(f"check {(b, h, m, n, d)} {str(dtype)[6:]} causal={causal}: max error {err:.2g}", flush=True)
    for d in (64, 128):
        n = 4096
        b, h = 16384 // n, 2048 // d
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float32) for _ in range(3))
        for causal in (False, True):
            flops = cost.attention_flops(b * h, n, n, d, causal)
            row = {}
            for name, fn in (("cuda_flash_attention", lambda: s.cuda_flash_attention(q, k, v, causal=causal)),
                             ("w35 composed fp32", lambda: s35.attention(q, k, v, causal=causal)),
                             ("triton flash fp32 ieee", lambda: s.flash_attention(q, k, v, causal=causal)),
                             ("SDPA math fp32", lambda: sdpa(SDPBackend.MATH, q, k, v, causal))):
                ms = bench.gpu_ms(fn, rep_ms=100)
                row[name] = ms
                print(f"d={d} N={n} causal={causal} {name}: {ms:.2f} ms, {flops / ms / 1e9:.1f} TFLOP/s, "
                      f"peak {bench.peak_mb(fn):.0f} MB", flush=True)
            print(f"  composed / cuda = {row['w35 composed fp32'] / row['cuda_flash_attention']:.2f}x", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


def tiles():
    for d in (64, 128):
        for n in (2048, 4096, 8192):
            b, h = 16384 // n, 2048 // d
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for causal in (False, True):
                flops = cost.attention_flops(b * h, n, n, d, causal)
                peers = {}
                for name, backend in (("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
                    peers[name] = flops / bench.gpu_ms(lambda: sdpa(backend, q, k, v, causal), rep_ms=50) / 1e9
                want = sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal).float()
                print(f"d={d} N={n} B={b} H={h} causal={causal}: FA2 {peers['FA2']:.0f}, cuDNN {peers['cuDNN']:.0f} TFLOP/s")
                for tiles in CONFIGS[d]:
                    try:
                        o, _ = s.flash_attention(q, k, v, causal=causal, tiles=tiles)
                        err = (o.float() - want).abs().max().item()
                        tf = flops / bench.gpu_ms(lambda: s.flash_attention(q, k, v, causal=causal, tiles=tiles),
                                                  rep_ms=50) / 1e9
                        print(f"  {tiles}: {tf:.0f} TFLOP/s ({tf / peers['FA2']:.2f}x FA2, {tf / peers['cuDNN']:.2f}x cuDNN)"
                              f" err {err:.2g}")
                    except Exception as exc:  # noqa: BLE001 - a config that does not fit is reported
                        print(f"  {tiles}: {type(exc).__name__} {str(exc)[:100]}")
            del q, k, v


if __name__ == "__main__":
    for part in sys.argv[1:] or ["tiles"]:
        globals()[part]()
