"""One launch of each kernel under study, for Nsight Compute (tools/exp_w33_bf16.py's kernels)."""
import importlib.util
import torch
from solutions import w33_softmax as s
spec = importlib.util.spec_from_file_location("exp", "tools/exp_w33_bf16.py")
exp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(exp)
x = torch.randn(1024, 65536, device="cuda", dtype=torch.bfloat16) * 4
o = torch.empty_like(x)
s.online_softmax(x, o)                      # looped kernel (bf16 default path)
exp.run_split(x, o, 4096, 4, None)          # split kernel
exp.run_lean(x, o, 4096, 8, 8, 3, None)     # lean looped, pipelined
x = torch.randn(4096, 16384, device="cuda", dtype=torch.bfloat16) * 4
o = torch.empty_like(x)
exp.run_row_lse(x, o, 16, 40)
exp.run_row(x, o, 16, None)
torch.cuda.synchronize()
