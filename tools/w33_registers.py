"""Registers and spills of softmax_kernel on a GPU (quoted in the day-4 notebook): python3 tools/w33_registers.py"""
import torch
import triton

from solutions import w33_softmax as s

for dtype, n in ((torch.float32, 1024), (torch.float32, 16384), (torch.float32, 65536), (torch.bfloat16, 16384)):
    x = torch.randn(1, n, device="cuda", dtype=dtype)
    block = triton.next_power_of_2(n)
    for cap in sorted({None, s.ROW_REGISTER_CAP.get((block, x.element_size()))}, key=str):
        handle = s.softmax_kernel[(1,)](x, torch.empty_like(x), n, BLOCK=block, maxnreg=cap,
                                        num_warps=s._row_warps(block, x.element_size()))
        print(f"{str(dtype)[6:]:9s} N={n:6d} maxnreg={cap}: {handle.n_regs} registers, {handle.n_spills} spilled")
