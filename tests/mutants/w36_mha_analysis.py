"""Wrong solutions of week 36 that the graders must reject (see course/mutants.py for the format)."""
from course.mutants import Mutant

MUTANTS = [
    # qk_cost
    Mutant("w36.qk_cost", "a multiply-add counted as one FLOP", "    flops = 2 * bh * m * n * d\n    nbytes = bh * (m * d + n * d + m * n)",
           "    flops = bh * m * n * d\n    nbytes = bh * (m * d + n * d + m * n)"),
    Mutant("w36.qk_cost", "the write of S left out", "nbytes = bh * (m * d + n * d + m * n) * element_size",
           "nbytes = bh * (m * d + n * d) * element_size"),
    Mutant("w36.qk_cost", "K counted with M rows", "nbytes = bh * (m * d + n * d + m * n) * element_size",
           "nbytes = bh * (m * d + m * d + m * n) * element_size"),
    Mutant("w36.qk_cost", "bytes counted in elements", "nbytes = bh * (m * d + n * d + m * n) * element_size",
           "nbytes = bh * (m * d + n * d + m * n)"),
    # pv_cost
    Mutant("w36.pv_cost", "V counted as (M, d)", "nbytes = bh * (m * n + n * d + m * d) * element_size",
           "nbytes = bh * (m * n + m * d + m * d) * element_size"),
    Mutant("w36.pv_cost", "the read of P left out", "nbytes = bh * (m * n + n * d + m * d) * element_size",
           "nbytes = bh * (n * d + m * d) * element_size"),
    Mutant("w36.pv_cost", "FLOPs of one head only", "    flops = 2 * bh * m * n * d\n    nbytes = bh * (m * n + n * d",
           "    flops = 2 * m * n * d\n    nbytes = bh * (m * n + n * d"),
    # largest_n
    Mutant("w36.largest_n", "Q, K, V and O forgotten: only the N² pairs count", "a, b = bh * square_bytes, 4 * bh * d * element_size",
           "a, b = bh * square_bytes, 0"),
    Mutant("w36.largest_n", "rounded up: one N too many", "    while n > 0 and a * n * n + b * n > memory_bytes:\n        n -= 1\n",
           "    n += 1\n"),
    Mutant("w36.largest_n", "Q, K, V, O counted in elements, not bytes", "a, b = bh * square_bytes, 4 * bh * d * element_size",
           "a, b = bh * square_bytes, 4 * bh * d"),
    # roofline_bound
    Mutant("w36.roofline_bound", "ridge without the unit conversion (TFLOP/s over GB/s)",
           "ridge = peak_tflops * 1e12 / (bandwidth_gbps * 1e9)", "ridge = peak_tflops / bandwidth_gbps"),
    Mutant("w36.roofline_bound", "the two bounds added instead of taking the larger",
           "ms = max(nbytes / (bandwidth_gbps * 1e9), flops / (peak_tflops * 1e12)) * 1e3",
           "ms = (nbytes / (bandwidth_gbps * 1e9) + flops / (peak_tflops * 1e12)) * 1e3"),
    Mutant("w36.roofline_bound", "the roofs swapped: above the ridge called memory-bound",
           "compute_bound = 1.0 if intensity > ridge else 0.0", "compute_bound = 0.0 if intensity > ridge else 1.0"),
    Mutant("w36.roofline_bound", "time in seconds, not ms",
           "flops / (peak_tflops * 1e12)) * 1e3", "flops / (peak_tflops * 1e12))"),
    # pipeline_bytes
    Mutant("w36.pipeline_bytes", "the causal softmax reads every score", "    softmax = bh * (kept + m * n) * element_size",
           "    softmax = bh * (m * n + m * n) * element_size"),
    Mutant("w36.pipeline_bytes", "causal mask off by one: the diagonal not kept",
           "kept = k * (k + 1) // 2 + (m - k) * n if causal else m * n", "kept = k * (k - 1) // 2 + (m - k) * n if causal else m * n"),
    Mutant("w36.pipeline_bytes", "the probabilities' write left out", "    softmax = bh * (kept + m * n) * element_size",
           "    softmax = bh * kept * element_size"),
    Mutant("w36.pipeline_bytes", "PV skips the masked half (cuBLAS does not)", "    pv = bh * (m * n + (n + m) * d) * element_size",
           "    pv = bh * (kept + (n + m) * d) * element_size"),
    # batched_softmax
    Mutant("w36.batched_softmax", "heads assumed contiguous: row r read at r·N, ignoring the strides",
           "s = tl.load(s_ptr + row_start[:, None] + cols[None, :]", "s = tl.load(s_ptr + r.to(tl.int64)[:, None] * N + cols[None, :]"),
    Mutant("w36.batched_softmax", "batch and head swapped in the row's index", "b, h = r // M // H, r // M % H",
           "h, b = r // M // H, r // M % H"),
    Mutant("w36.batched_softmax", "causal mask off by one: the diagonal is masked", "end = tl.minimum(end, i + 1)",
           "end = tl.minimum(end, i)"),
    Mutant("w36.batched_softmax", "scale never applied", "x = tl.where(keep, s * scale, -float(\"inf\"))",
           "x = tl.where(keep, s, -float(\"inf\"))"),
    Mutant("w36.batched_softmax", "max and sum over the rows (axis 0) instead of along each row",
           "    top = tl.max(x, axis=1)\n", "    top = tl.broadcast_to(tl.max(tl.max(x, axis=0), axis=0), [ROWS])\n"),
]
