"""HBM traffic of each stage of standard attention, measured by Nsight Compute (ncu), next to the cost model.

`collect()` runs, for each stage and size, this module as a small program under
`ncu --clock-control none`, reading two counters of every kernel launched inside the NVTX range "w36":
dram__bytes_read.sum and dram__bytes_write.sum (bytes that crossed the HBM interface; ncu flushes the
caches before each kernel, so the inputs start in HBM). The program warms the stage up outside the range,
then launches it once inside. Run on a GPU with ncu:  python -m course.w36_mha_analysis.traffic
"""
import csv
import glob
import io
import math
import os
import shutil
import subprocess
import sys

from .. import attention_cost as cost

B, H, D = 4, 16, 128
SIZES = (2048, 4096)
# (stage, mask): what the three-kernel pipeline launches
STAGES = (("qk", "none"), ("softmax", "none"), ("softmax", "causal"), ("pv", "none"))
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")


def ncu_path() -> str | None:
    found = shutil.which("ncu") or sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))
    return found if isinstance(found, str) else (found[-1] if found else None)


def model_bytes(stage: str, mask: str, n: int) -> int:
    if stage == "qk":
        return cost.qk_cost(B * H, n, n, D, 2)["bytes"]
    if stage == "pv":
        return cost.pv_cost(B * H, n, n, D, 2)["bytes"]
    return cost.softmax_cost(B * H, n, n, 2, causal=mask == "causal")["bytes"]


def launch(stage: str, mask: str, n: int) -> None:
    """The program ncu watches: one launch of `stage` at size n inside the NVTX range "w36"."""
    import torch
    from ..registry import kernels
    s35 = kernels("w35_attention_blocks")
    q, k, v = (torch.randn(B, H, n, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scores = torch.matmul(q, k.transpose(-1, -2))
    probs, out = torch.empty_like(scores), torch.empty_like(q)
    run = {"qk": lambda: torch.matmul(q, k.transpose(-1, -2), out=scores),
           "softmax": lambda: s35.scale_mask_softmax(scores, probs, 1 / math.sqrt(D), causal=mask == "causal"),
           "pv": lambda: torch.matmul(probs, v, out=out)}[stage]
    run()  # compile and warm up outside the range
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("w36")
    run()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def _parse(text: str) -> dict:
    """{kernel name: {metric: value}} from ncu's --csv output (other lines are skipped)."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    kernels = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        if row.get("Metric Name") in METRICS:
            key = f'{row["ID"]}: {row["Kernel Name"]}'
            kernels.setdefault(key, {})[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
    return kernels


def measure(stage: str, mask: str, n: int, ncu: str) -> dict:
    """One ncu run of `launch(stage, mask, n)`: DRAM bytes read and written by the kernels in the range."""
    cmd = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", "w36/", "--metrics", ",".join(METRICS),
           "--csv", "--print-units", "base", sys.executable, "-m", "course.w36_mha_analysis.traffic",
           "--launch", stage, mask, str(n)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    kernels = _parse(done.stdout)
    if done.returncode != 0 or not kernels:
        raise RuntimeError(f"ncu found no kernel for {stage} {mask} N={n} (exit {done.returncode}):\n"
                           f"{done.stdout[-1500:]}\n{done.stderr[-1500:]}")
    read = sum(k.get(METRICS[0], 0.0) for k in kernels.values())
    write = sum(k.get(METRICS[1], 0.0) for k in kernels.values())
    return {"kernels": "; ".join(name.split(": ", 1)[1][:60] for name in kernels), "launches": len(kernels),
            "dram_read_bytes": read, "dram_write_bytes": write}


def collect(sizes=SIZES):
    """Model against ncu for every stage and size, as a DataFrame (needs a GPU and ncu)."""
    import pandas as pd
    from .. import bench
    ncu = ncu_path()
    if ncu is None:
        raise RuntimeError("ncu (Nsight Compute) is not installed here")
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    rows = []
    for n in sizes:
        for stage, mask in STAGES:
            got = measure(stage, mask, n, ncu)
            model = model_bytes(stage, mask, n)
            measured = got["dram_read_bytes"] + got["dram_write_bytes"]
            rows.append({"stage": stage, "mask": mask, "B": B, "H": H, "N": n, "d": D, "dtype": "bfloat16",
                         "model_bytes": model, **got, "dram_bytes": measured, "measured / model": measured / model})
    table = pd.DataFrame(rows)
    for key, value in {**bench.provenance(), "ncu": version}.items():
        table[key] = value
    return table.round({"measured / model": 3})


if __name__ == "__main__":
    if sys.argv[1:2] == ["--launch"]:
        launch(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        from ..bench import RESULTS
        result = collect()
        path = sys.argv[1] if len(sys.argv) > 1 else RESULTS / "w36_ncu.csv"
        result.to_csv(path, index=False)
        print(result.drop(columns=["kernels"]).to_string(index=False))
        print(f"wrote {path}")
