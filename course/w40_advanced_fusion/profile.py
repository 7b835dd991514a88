"""Nsight Compute on the course's attention and on the fastest peer that ships with PyTorch (SDPA's cuDNN backend),
forward and backward: what the counters say about the gap between them (day 5).

Each run is `ncu --clock-control none --nvtx --nvtx-include w40/ --metrics ... --csv`, watching one
launch of one workload inside the NVTX range "w40" (the workload runs once outside it first: compilation, autotuning
and warm-up are not profiled). The table keeps ncu's own rows (Kernel Name, Metric Name as its details page names it,
Metric Unit, Metric Value) with the workload's label. Run on a GPU with ncu:  python -m course.w40_advanced_fusion.profile
"""
import csv
import io
import os
import subprocess
import sys

from ..w36_mha_analysis.traffic import ncu_path  # one home for finding ncu

B, H, N, D = 4, 16, 4096, 128  # B·N = 16384 tokens, as the benchmark's shoulders part
# ncu metric -> the name its details page shows (the table keeps the shown name)
METRICS = {"gpu__time_duration.sum": "Duration",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed": "Compute (SM) Throughput",
           "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "Memory Throughput",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM Throughput",
           "launch__registers_per_thread": "Registers Per Thread",
           "launch__shared_mem_per_block_static": "Static Shared Memory Per Block",
           "launch__shared_mem_per_block_dynamic": "Dynamic Shared Memory Per Block",
           "sm__maximum_warps_per_active_cycle_pct": "Theoretical Occupancy",
           "sm__warps_active.avg.pct_of_peak_sustained_active": "Achieved Occupancy",
           "launch__occupancy_limit_registers": "Block Limit Registers",
           "launch__occupancy_limit_shared_mem": "Block Limit Shared Mem",
           "smsp__issue_active.avg.pct_of_peak_sustained_active": "Issue Slots Busy",
           "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "Tensor Pipe Active (hmma)",
           "sm__inst_executed_pipe_tensor_op_gmma.sum": "Tensor (wgmma) Instructions"}
WORKLOADS = ("course forward", "course backward", "cuDNN forward", "cuDNN backward")
# which launches ncu profiles: those inside the NVTX range, except where autograd launches them from its own thread
# (NVTX ranges are per thread): then the kernels named like cuDNN's backward, the last call's (the first is warm-up)
FILTERS = {label: ["--nvtx", "--nvtx-include", "w40/"] for label in WORKLOADS}
FILTERS["cuDNN backward"] = ["--kernel-name", "regex:bprop|bwd|dgrad|dq|dkdv", "--launch-skip", "0"]


def launch(label: str) -> None:
    """The program ncu watches: one call of the workload `label` (causal, bf16) inside the NVTX range "w40"."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..registry import kernels
    flash = kernels("w38_flash_attention_impl")
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    if label.startswith("course"):
        o, lse = flash.flash_forward(q, k, v, True)
        run = (lambda: flash.flash_forward(q, k, v, True)) if label.endswith("forward") else \
            (lambda: flash.flash_backward(q, k, v, o, do, lse, True))
    else:
        def forward():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = forward()
        run = forward if label.endswith("forward") else \
            (lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
    run()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("w40")
    run()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def measure(label: str, ncu: str) -> list[dict]:
    """ncu's detail rows of every kernel `launch(label)` runs inside the range, each with the workload's label."""
    cmd = [ncu, "--clock-control", "none", *FILTERS[label], "--metrics", ",".join(METRICS), "--csv", sys.executable, "-m", "course.w40_advanced_fusion.profile", "--launch", label]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = [line for line in done.stdout.splitlines() if line.startswith('"')]
    rows = [{"workload": label, **row, "Metric Name": METRICS.get(row.get("Metric Name"), row.get("Metric Name"))}
            for row in csv.DictReader(io.StringIO("\n".join(lines)))]
    if label == "cuDNN backward":  # warm-up and measured call launch the same kernels: keep the measured call's
        ids = sorted({int(row["ID"]) for row in rows})
        rows = [row for row in rows if int(row["ID"]) >= ids[len(ids) // 2]]
    if done.returncode != 0 or not rows:
        raise RuntimeError(f"ncu found no kernel for {label} (exit {done.returncode}):\n{done.stdout[-1500:]}\n"
                           f"{done.stderr[-1500:]}")
    return rows


def collect(workloads=WORKLOADS):
    """Every workload's ncu rows as one DataFrame, stamped with the provenance (needs a GPU and ncu)."""
    import pandas as pd

    from .. import bench
    ncu = ncu_path()
    if ncu is None:
        raise RuntimeError("ncu (Nsight Compute) is not installed here")
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    table = pd.DataFrame([row for label in workloads for row in measure(label, ncu)])
    keep = ["workload", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
    table = table[[c for c in keep if c in table]]
    for key, value in {**bench.provenance(), "ncu": version, "B": B, "H": H, "N": N, "d": D}.items():
        table[key] = value
    return table


if __name__ == "__main__":
    if sys.argv[1:2] == ["--launch"]:
        launch(sys.argv[2])
    else:
        out = sys.argv[1] if len(sys.argv) > 1 else str(__import__("course.bench", fromlist=["RESULTS"]).RESULTS
                                                        / "w40_ncu.csv")
        collect().to_csv(out, index=False)
        print(f"wrote {out}")
