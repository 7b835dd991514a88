#!/usr/bin/env bash
# One call on a lent GPU: doctor, grade the solutions, mutants, then the benchmark of a week.
# Usage (repository root, on the GPU machine): bash tools/gpu_check.sh w33 [extra python -c code]
set -uo pipefail
sel=${1:-w33}
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
# usage note: COURSE_COMMIT=<hash> stamps recorded results when the copied tree has no .git
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/device.txt"
python3 -m course doctor
python3 -m course grade "$sel" --solutions 2>&1 | tee "$out/grade.txt"
# mutants in SHARDS processes (a week's take minutes each: every mutant compiles its kernels anew)
shards=${SHARDS:-4}
for k in $(seq 0 $((shards - 1))); do
  python3 -m course mutants "$sel" --shard "$k/$shards" > "$out/mutants_$k.txt" 2>&1 &
done
wait
cat "$out"/mutants_*.txt > "$out/mutants.txt" && rm "$out"/mutants_*.txt
grep -E "passed|ACCEPTED|REJECTED|without its hint" "$out/mutants.txt"
python3 -m pytest -q tests/test_split_softmax.py 2>&1 | tail -3
if [ -n "${2:-}" ]; then python3 -c "$2" 2>&1 | tee "$out/extra.txt"; fi
python3 -m course bench "$sel" --csv "$out/bench.csv" 2>&1 | tail -80
