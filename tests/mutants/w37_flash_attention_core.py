"""Wrong solutions of week 37 that the graders must reject (see course/mutants.py for the format).
Each `hint` is a phrase of the diagnosis the grader must give (course/w37_flash_attention_core/tasks.py, *_variants)."""
from course.mutants import Mutant, Variant

# Words of the forward diagnoses, shared by the NumPy, Triton and CUDA C forwards
ACC = "the accumulator was not rescaled"
SUM = "the running sum was not rescaled"
NEITHER = "neither l nor the accumulator was rescaled"
NO_DIVISION = "the output was not divided by l"
MAX_AT_0 = "the running max starts at 0"
NO_SCALE = "the scale 1/√d is missing"
SCALE_TWICE = "the scale 1/√d was applied twice"
DIAGONAL = "the diagonal was masked"
PAST_DIAGONAL = "one key past the diagonal was kept"
NO_CAUSAL = "no causal mask"
TAIL = "the tail block is not masked"
BASE_2 = "the log-sum-exp is in base 2"
NO_MAX = "the log-sum-exp is missing the running max"
QUADRATIC = "Is a (B, H, M, N) tensor allocated somewhere?"

MUTANTS = [
    # online_update
    Mutant("w37.online_update", "accumulator not rescaled: the old output keeps the old max's scale",
           "o_new = (o * (alpha * l)[:, None] + p @ v)", "o_new = (o * l[:, None] + p @ v)",
           hint="the old output was not rescaled"),
    Mutant("w37.online_update", "l not rescaled: the old sum is added as it was", "l_new = alpha * l + p.sum(axis=1)",
           "l_new = l + p.sum(axis=1)", hint="the old sum l was not rescaled"),
    Mutant("w37.online_update", "NaN on a row with no key yet: exp(-inf - (-inf))",
           "shift = np.where(m_new == -np.inf, 0.0, m_new)", "shift = m_new", hint="exp(-inf − (-inf)) is NaN"),
    Mutant("w37.online_update", "output not normalised by the new sum",
           "o_new = (o * (alpha * l)[:, None] + p @ v) / np.where(l_new > 0, l_new, 1.0)[:, None]",
           "o_new = o * (alpha * l)[:, None] + p @ v", hint="not divided by the new sum"),
    Mutant("w37.online_update", "the normalised old output rescaled without its old sum l",
           "o_new = (o * (alpha * l)[:, None] + p @ v)", "o_new = (o * alpha[:, None] + p @ v)",
           hint="the old output needs its old sum back"),
    Mutant("w37.online_update", "alpha from the new max: exp(m_new - m_new) = 1, nothing rescaled",
           "alpha = np.exp(m - shift)", "alpha = np.exp(m_new - shift)", hint="the old sum l was not rescaled"),
    Mutant("w37.online_update", "m is the tile's max, not the running max", "m_new = np.maximum(m, s.max(axis=1))",
           "m_new = s.max(axis=1)", hint="m must be the running max"),
    # tiled_attention
    Mutant("w37.tiled_attention", "running max initialised to 0: large negative logits underflow",
           "m_i, l_i, o_i = np.full(len(rows), -np.inf), np.zeros(len(rows))",
           "m_i, l_i, o_i = np.zeros(len(rows)), np.zeros(len(rows))", hint=MAX_AT_0),
    Mutant("w37.tiled_attention", "causal mask off by one: the diagonal is masked",
           "s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)", "s = np.where(cols[None, :] < rows[:, None], s, -np.inf)",
           hint=DIAGONAL),
    Mutant("w37.tiled_attention", "partial last key block skipped", "for start in range(0, last, block_n):",
           "for start in range(0, last // block_n * block_n, block_n):", hint="the partial last key block is skipped"),
    Mutant("w37.tiled_attention", "scale missing", "s = scale * (q[z][rows] @ k[z][cols].T)", "s = q[z][rows] @ k[z][cols].T",
           hint=NO_SCALE),
    Mutant("w37.tiled_attention", "scale applied twice", "s = scale * (q[z][rows] @ k[z][cols].T)",
           "s = scale * scale * (q[z][rows] @ k[z][cols].T)", hint=SCALE_TWICE),
    Mutant("w37.tiled_attention", "causal mask off by one: one key past the diagonal kept",
           "s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)",
           "s = np.where(cols[None, :] <= rows[:, None] + 1, s, -np.inf)", hint=PAST_DIAGONAL),
    Mutant("w37.tiled_attention", "no causal mask inside the blocks (the key loop still stops at the block's end)",
           "s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)", "s = s", hint=NO_CAUSAL),
    Mutant("w37.tiled_attention", "causal key loop stops at the block's first query",
           "last = min(first + block_m, n) if causal else n", "last = min(first, n) if causal else n",
           hint="the key loop stops at the block's first query"),
    Mutant("w37.tiled_attention", "log-sum-exp in base 2", "lse[z][rows] = m_i + np.log(l_i)",
           "lse[z][rows] = m_i + np.log2(l_i)", hint=BASE_2),
    Mutant("w37.tiled_attention", "log-sum-exp without the running max", "lse[z][rows] = m_i + np.log(l_i)",
           "lse[z][rows] = np.log(l_i)", hint=NO_MAX),
    # hbm_traffic
    Mutant("w37.hbm_traffic", "K and V read once in all, not once per query block",
           "keys += min(first + block_m, n) if causal else n", "keys = min(first + block_m, n) if causal else n",
           hint="K and V are read once per query block"),
    Mutant("w37.hbm_traffic", "causal blocks read every key", "keys += min(first + block_m, n) if causal else n", "keys += n",
           hint="a query block needs only the keys up to its last query"),
    Mutant("w37.hbm_traffic", "the log-sum-exp write forgotten", "writes = bh * (m * d + m)", "writes = bh * m * d",
           hint="the log-sum-exp is written too"),
    Mutant("w37.hbm_traffic", "a partial last query block not counted",
           "    for first in range(0, m, block_m):\n        keys +=", "    for first in range(0, m - block_m + 1, block_m):\n        keys +=",
           hint="a partial last query block is a block too"),
    Mutant("w37.hbm_traffic", "the output written twice", "writes = bh * (m * d + m)", "writes = bh * (2 * m * d + m)",
           hint="O is written once"),
    Mutant("w37.hbm_traffic", "counted in bytes of float16 (element size 2), not elements",
           "    writes = bh * (m * d + m)\n", "    writes = bh * (m * d + m)\n    reads, writes = 2 * reads, 2 * writes\n",
           hint="in elements, not bytes"),
    Mutant("w37.hbm_traffic", "V forgotten: only K read per query block", "reads = bh * (m * d + 2 * keys * d)",
           "reads = bh * (m * d + keys * d)", hint="V is read along with K"),
    # causal_tile_bounds
    Mutant("w37.causal_tile_bounds", "stop not clamped to N", "stop = min((pid_m + 1) * block_m, n)", "stop = (pid_m + 1) * block_m",
           hint="stop never passes N"),
    Mutant("w37.causal_tile_bounds", "free not rounded down to whole key blocks",
           "free = min(pid_m * block_m, n) // block_n * block_n", "free = min(pid_m * block_m, n)",
           hint="free is rounded down to whole key blocks"),
    Mutant("w37.causal_tile_bounds", "the diagonal block left out: stop at the block's first query",
           "stop = min((pid_m + 1) * block_m, n)", "stop = min(pid_m * block_m, n)",
           hint="so the diagonal block is loaded"),
    Mutant("w37.causal_tile_bounds", "stop off by one in the last tile: clamped to N - 1",
           "stop = min((pid_m + 1) * block_m, n)", "stop = min((pid_m + 1) * block_m, n - 1)",
           hint="stop is off by one in the last tile"),
    Mutant("w37.causal_tile_bounds", "free not clamped to N", "free = min(pid_m * block_m, n) // block_n * block_n",
           "free = pid_m * block_m // block_n * block_n", hint="free never passes N"),
    # flash_attention
    Mutant("w37.flash_attention", "accumulator not rescaled", "acc = acc * alpha[:, None] + tl.dot(",
           "acc = acc + tl.dot(", hint=ACC),
    Mutant("w37.flash_attention", "l not rescaled", "l_i = l_i * alpha + tl.sum(p, axis=1)", "l_i = l_i + tl.sum(p, axis=1)",
           hint=SUM),
    Mutant("w37.flash_attention", "running max initialised to 0", 'm_i = tl.full([BLOCK_M], -float("inf"), tl.float32)',
           "m_i = tl.zeros([BLOCK_M], tl.float32)", hint=MAX_AT_0),
    Mutant("w37.flash_attention", "scale missing: exp2 of the raw scores", "s = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale",
           "s = tl.dot(q, k_t, input_precision=PRECISION)", hint=NO_SCALE),
    Mutant("w37.flash_attention", "causal mask off by one", "keep = keep & (cols[None, :] <= rows[:, None])",
           "keep = keep & (cols[None, :] < rows[:, None])", hint=DIAGONAL),
    Mutant("w37.flash_attention", "tail tile unmasked: keys past N enter the softmax as zeros", "keep = cols[None, :] < N",
           "keep = cols[None, :] >= 0", hint=TAIL),
    Mutant("w37.flash_attention", "an N × N float32 scratch buffer kept from week 35: right numbers, quadratic memory",
           "    flash_attention_kernel[(triton.cdiv(m, block_m), bsz * heads)](",
           "    scores = torch.empty((bsz, heads, m, n), dtype=torch.float32, device=q.device)  # noqa: F841\n"
           "    flash_attention_kernel[(triton.cdiv(m, block_m), bsz * heads)](", needs_gpu=True, hint=QUADRATIC),
    Mutant("w37.flash_attention", "final normalisation missing: O = acc", "o = acc / l_safe[:, None]", "o = acc",
           hint=NO_DIVISION),
    Mutant("w37.flash_attention", "scale applied twice", "s = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale",
           "s = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale * qk_scale", hint=SCALE_TWICE),
    Mutant("w37.flash_attention", "causal mask off by one: one key past the diagonal kept",
           "keep = keep & (cols[None, :] <= rows[:, None])", "keep = keep & (cols[None, :] <= rows[:, None] + 1)",
           hint=PAST_DIAGONAL),
    Mutant("w37.flash_attention", "no causal mask", "keep = keep & (cols[None, :] <= rows[:, None])", "keep = keep",
           hint=NO_CAUSAL),
    Mutant("w37.flash_attention", "alpha from the new max: exp2(m_new - m_new) = 1, nothing rescaled",
           "alpha = tl.exp2(m_i - m_safe)", "alpha = tl.exp2(m_new - m_safe)", hint=NEITHER),
    Mutant("w37.flash_attention", "LSE left in base 2", "(m_i + tl.log2(l_safe)) / LOG2E",
           "(m_i + tl.log2(l_safe))", hint=BASE_2),
    Mutant("w37.flash_attention", "LSE without the running max", "(m_i + tl.log2(l_safe)) / LOG2E",
           "tl.log2(l_safe) / LOG2E", hint=NO_MAX),
    # cuda_flash_attention (CUDA C: run on a GPU; on a CPU they compile and are skipped)
    Mutant("w37.cuda_flash_attention", "accumulator not rescaled",
           "for (int c = 0; c < 2; ++c) for (int e = 0; e < 4; ++e) acc[i][c][e] *= alpha;", "", hint=ACC),
    Mutant("w37.cuda_flash_attention", "l not rescaled", "l_i[i] = l_i[i] * alpha + sum;", "l_i[i] = l_i[i] + sum;",
           hint=SUM),
    Mutant("w37.cuda_flash_attention", "running max initialised to 0", "m_i[i] = -INFINITY; l_i[i] = 0.f;",
           "m_i[i] = 0.f; l_i[i] = 0.f;", hint=MAX_AT_0),
    Mutant("w37.cuda_flash_attention", "scale missing", "s[i][j] = keep ? s[i][j] * qk_scale : -INFINITY;",
           "s[i][j] = keep ? s[i][j] : -INFINITY;", hint=NO_SCALE),
    Mutant("w37.cuda_flash_attention", "causal mask off by one: the diagonal is masked", "(!causal || col <= row)",
           "(!causal || col < row)", hint=DIAGONAL),
    Mutant("w37.cuda_flash_attention", "tail tile unmasked: keys past N enter the softmax as zeros",
           "const bool keep = col < N && (!causal || col <= row);", "const bool keep = !causal || col <= row;", hint=TAIL),
    # (No NaN mutant here: with top-left causal masks every valid row sees key 0 in its first tile, so the kernel's
    # guard against exp2(-inf - (-inf)) never fires; the NumPy online_update grader rejects that bug.)
    Mutant("w37.cuda_flash_attention", "the running max overwritten before the rescale factor is computed: alpha is 1, "
           "nothing is rescaled",
           "            const float alpha = exp2f(m_i[i] - base);",
           "            m_i[i] = m_new;\n            const float alpha = exp2f(m_i[i] - base);", hint=NEITHER),
    Mutant("w37.cuda_flash_attention", "causal mask with the row's index in the tile, not in the sequence (i instead "
           "of q_start + i)",
           "const int row = first + ty * 4 + i;\n            float top = -INFINITY;",
           "const int row = ty * 4 + i;\n            float top = -INFINITY;", hint="index inside its block"),
    Mutant("w37.cuda_flash_attention", "LSE left in base 2 (the exp2 units), not turned back into a natural log",
           "(m_i[i] + log2f(l)) * LN2", "(m_i[i] + log2f(l))", hint=BASE_2),
    Mutant("w37.cuda_flash_attention", "the row max taken over this thread's four keys only, not the row's 16 threads",
           "                top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, lane));",
           "                top = fmaxf(top, top);", hint="the CUDA row max was taken over one thread's keys"),
    Mutant("w37.cuda_flash_attention", "an N × N float32 scratch buffer kept from week 35: right numbers, quadratic memory",
           "    o = torch.empty((bsz, heads, m, d), dtype=q.dtype, device=q.device)\n    lse = torch.empty((bsz, heads, m), "
           "dtype=torch.float32, device=q.device)\n    row_floats",
           "    o = torch.empty((bsz, heads, m, d), dtype=q.dtype, device=q.device)\n    lse = torch.empty((bsz, heads, m), "
           "dtype=torch.float32, device=q.device)\n    scores = torch.empty((bsz, heads, m, n), dtype=torch.float32, "
           "device=q.device)  # noqa: F841\n    row_floats", needs_gpu=True, hint=QUADRATIC),
    Mutant("w37.cuda_flash_attention", "causal mask off by one: one key past the diagonal kept", "(!causal || col <= row)",
           "(!causal || col <= row + 1)", hint=PAST_DIAGONAL),
    Mutant("w37.cuda_flash_attention", "no causal mask", "const bool keep = col < N && (!causal || col <= row);",
           "const bool keep = col < N;", hint=NO_CAUSAL),
    Mutant("w37.cuda_flash_attention", "scale applied twice", "s[i][j] = keep ? s[i][j] * qk_scale : -INFINITY;",
           "s[i][j] = keep ? s[i][j] * qk_scale * qk_scale : -INFINITY;", hint=SCALE_TWICE),
]

# Correct solutions written another way: the graders must accept them.
VARIANTS = [
    Variant("w37.flash_attention", "other tiles: query blocks narrower than key blocks",
            "GPU_TILES = {64: (128, 64, 8, 3), 128: (128, 64, 8, 3)}\nCPU_TILES = (32, 16, 4, 1)",
            "GPU_TILES = {64: (64, 128, 4, 2), 128: (64, 64, 4, 2)}\nCPU_TILES = (16, 32, 4, 1)"),
]
