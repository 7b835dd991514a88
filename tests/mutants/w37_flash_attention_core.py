"""Wrong solutions of week 37 that the graders must reject (see course/mutants.py for the format)."""
from course.mutants import Mutant

MUTANTS = [
    # online_update
    Mutant("w37.online_update", "accumulator not rescaled: the old output keeps the old max's scale",
           "o_new = (o * (alpha * l)[:, None] + p @ v)", "o_new = (o * l[:, None] + p @ v)"),
    Mutant("w37.online_update", "l not rescaled: the old sum is added as it was", "l_new = alpha * l + p.sum(axis=1)",
           "l_new = l + p.sum(axis=1)"),
    Mutant("w37.online_update", "NaN on a row with no key yet: exp(-inf - (-inf))",
           "shift = np.where(m_new == -np.inf, 0.0, m_new)", "shift = m_new"),
    Mutant("w37.online_update", "output not normalised by the new sum",
           "o_new = (o * (alpha * l)[:, None] + p @ v) / np.where(l_new > 0, l_new, 1.0)[:, None]",
           "o_new = o * (alpha * l)[:, None] + p @ v"),
    # tiled_attention
    Mutant("w37.tiled_attention", "running max initialised to 0: large negative logits underflow",
           "m_i, l_i, o_i = np.full(len(rows), -np.inf), np.zeros(len(rows))",
           "m_i, l_i, o_i = np.zeros(len(rows)), np.zeros(len(rows))"),
    Mutant("w37.tiled_attention", "causal mask off by one: the diagonal is masked",
           "s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)", "s = np.where(cols[None, :] < rows[:, None], s, -np.inf)"),
    Mutant("w37.tiled_attention", "partial last key block skipped", "for start in range(0, last, block_n):",
           "for start in range(0, last // block_n * block_n, block_n):"),
    Mutant("w37.tiled_attention", "scale missing", "s = scale * (q[z][rows] @ k[z][cols].T)", "s = q[z][rows] @ k[z][cols].T"),
    # hbm_traffic
    Mutant("w37.hbm_traffic", "K and V read once in all, not once per query block",
           "keys += min(first + block_m, n) if causal else n", "keys = min(first + block_m, n) if causal else n"),
    Mutant("w37.hbm_traffic", "causal blocks read every key", "keys += min(first + block_m, n) if causal else n", "keys += n"),
    Mutant("w37.hbm_traffic", "the log-sum-exp write forgotten", "writes = bh * (m * d + m)", "writes = bh * m * d"),
    Mutant("w37.hbm_traffic", "a partial last query block not counted",
           "    for first in range(0, m, block_m):\n        keys +=", "    for first in range(0, m - block_m + 1, block_m):\n        keys +="),
    # causal_tile_bounds
    Mutant("w37.causal_tile_bounds", "stop not clamped to N", "stop = min((pid_m + 1) * block_m, n)", "stop = (pid_m + 1) * block_m"),
    Mutant("w37.causal_tile_bounds", "free not rounded down to whole key blocks",
           "free = min(pid_m * block_m, n) // block_n * block_n", "free = min(pid_m * block_m, n)"),
    Mutant("w37.causal_tile_bounds", "the diagonal block left out: stop at the block's first query",
           "stop = min((pid_m + 1) * block_m, n)", "stop = min(pid_m * block_m, n)"),
    # flash_attention
    Mutant("w37.flash_attention", "accumulator not rescaled", "acc = acc * alpha[:, None] + tl.dot(",
           "acc = acc + tl.dot("),
    Mutant("w37.flash_attention", "l not rescaled", "l_i = l_i * alpha + tl.sum(p, axis=1)", "l_i = l_i + tl.sum(p, axis=1)"),
    Mutant("w37.flash_attention", "running max initialised to 0", 'm_i = tl.full([BLOCK_M], -float("inf"), tl.float32)',
           "m_i = tl.zeros([BLOCK_M], tl.float32)"),
    Mutant("w37.flash_attention", "scale missing: exp2 of the raw scores", "s = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale",
           "s = tl.dot(q, k_t, input_precision=PRECISION)"),
    Mutant("w37.flash_attention", "causal mask off by one", "keep = keep & (cols[None, :] <= rows[:, None])",
           "keep = keep & (cols[None, :] < rows[:, None])"),
    Mutant("w37.flash_attention", "tail tile unmasked: keys past N enter the softmax as zeros", "keep = cols[None, :] < N",
           "keep = cols[None, :] >= 0"),
    Mutant("w37.flash_attention", "an N × N float32 scratch buffer kept from week 35: right numbers, quadratic memory",
           "    flash_attention_kernel[(triton.cdiv(m, block_m), bsz * heads)](",
           "    scores = torch.empty((bsz, heads, m, n), dtype=torch.float32, device=q.device)  # noqa: F841\n"
           "    flash_attention_kernel[(triton.cdiv(m, block_m), bsz * heads)](", needs_gpu=True),
    # cuda_flash_attention (CUDA C: run on a GPU; on a CPU they compile and are skipped)
    Mutant("w37.cuda_flash_attention", "accumulator not rescaled",
           "for (int c = 0; c < 2; ++c) for (int e = 0; e < 4; ++e) acc[i][c][e] *= alpha;", ""),
    Mutant("w37.cuda_flash_attention", "l not rescaled", "l_i[i] = l_i[i] * alpha + sum;", "l_i[i] = l_i[i] + sum;"),
    Mutant("w37.cuda_flash_attention", "running max initialised to 0", "m_i[i] = -INFINITY; l_i[i] = 0.f;",
           "m_i[i] = 0.f; l_i[i] = 0.f;"),
    Mutant("w37.cuda_flash_attention", "scale missing", "s[i][j] = keep ? s[i][j] * qk_scale : -INFINITY;",
           "s[i][j] = keep ? s[i][j] : -INFINITY;"),
    Mutant("w37.cuda_flash_attention", "causal mask off by one: the diagonal is masked", "(!causal || col <= row)",
           "(!causal || col < row)"),
    Mutant("w37.cuda_flash_attention", "tail tile unmasked: keys past N enter the softmax as zeros",
           "const bool keep = col < N && (!causal || col <= row);", "const bool keep = !causal || col <= row;"),
    # (No NaN mutant here: with top-left causal masks every valid row sees key 0 in its first tile, so the kernel's
    # guard against exp2(-inf - (-inf)) never fires; the NumPy online_update grader rejects that bug.)
    Mutant("w37.cuda_flash_attention", "the running max overwritten before the rescale factor is computed (seeds 001 "
           "and 002 order it so): alpha is 1, nothing is rescaled",
           "            const float alpha = exp2f(m_i[i] - base);",
           "            m_i[i] = m_new;\n            const float alpha = exp2f(m_i[i] - base);"),
    Mutant("w37.cuda_flash_attention", "causal mask with the row's index in the tile, not in the sequence (seed 003's "
           "pitfall: i instead of q_start + i)",
           "const int row = first + ty * 4 + i;\n            float top = -INFINITY;",
           "const int row = ty * 4 + i;\n            float top = -INFINITY;"),
    Mutant("w37.cuda_flash_attention", "LSE left in base 2 (the exp2 units), not turned back into a natural log",
           "(m_i[i] + log2f(l)) * LN2", "(m_i[i] + log2f(l))"),
    Mutant("w37.cuda_flash_attention", "the row max taken over this thread's four keys only, not the row's 16 threads",
           "                top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, lane));",
           "                top = fmaxf(top, top);"),
    Mutant("w37.cuda_flash_attention", "an N × N float32 scratch buffer kept from week 35: right numbers, quadratic memory",
           "    o = torch.empty((bsz, heads, m, d), dtype=q.dtype, device=q.device)\n    lse = torch.empty((bsz, heads, m), "
           "dtype=torch.float32, device=q.device)\n    row_floats",
           "    o = torch.empty((bsz, heads, m, d), dtype=q.dtype, device=q.device)\n    lse = torch.empty((bsz, heads, m), "
           "dtype=torch.float32, device=q.device)\n    scores = torch.empty((bsz, heads, m, n), dtype=torch.float32, "
           "device=q.device)  # noqa: F841\n    row_floats", needs_gpu=True),
]
