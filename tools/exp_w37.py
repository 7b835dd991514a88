"""Week-37 sweep, on a GPU from the repository root: python3 tools/exp_w37.py
The Triton FlashAttention forward's tiles against SDPA's FlashAttention-2 and cuDNN backends, bf16,
batch·N = 16384 tokens, heads·d = 2048 (the issue's shapes); every config checked before it is timed."""
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


def main():
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
    main()
