"""Wrong solutions of week 33 that the graders must reject (see course/mutants.py for the format).
Each `hint` is words of the diagnosis course/w33_softmax/tasks.py gives for that bug."""
from course.mutants import Mutant, Variant

MUTANTS = [
    # stable_softmax
    Mutant("w33.stable_softmax", "missing max-subtraction: exp overflows on huge logits",
           "    shifted = x - x.max(axis=-1, keepdims=True)\n    e = np.exp(shifted)", "    e = np.exp(x)",
           hint="subtract each row's max before exp"),
    Mutant("w33.stable_softmax", "normalised by the sum of the whole array, not of each row",
           "e / e.sum(axis=-1, keepdims=True)", "e / e.sum()", hint="divided by the sum over the whole tensor"),
    Mutant("w33.stable_softmax", "max taken over the wrong axis",
           "x.max(axis=-1, keepdims=True)", "x.max(axis=0, keepdims=True)", hint="the max is taken along the wrong axis"),
    Mutant("w33.stable_softmax", "one max for the whole tensor instead of each row's",
           "shifted = x - x.max(axis=-1, keepdims=True)", "shifted = x - x.max()",
           hint="subtract one max for the whole tensor"),
    Mutant("w33.stable_softmax", "sum taken over the wrong axis",
           "e / e.sum(axis=-1, keepdims=True)", "e / e.sum(axis=0, keepdims=True)",
           hint="each column sums to 1 instead of each row"),
    # block_softmax (CUDA C shared-memory tree)
    Mutant("w33.block_softmax", "tree starts at THREADS/4: half the threads' values are dropped",
           "for (int stride = THREADS / 2; stride > 0;", "for (int stride = THREADS / 4; stride > 0;",
           hint="the reduction drops half the threads"),
    Mutant("w33.block_softmax", "tree stops before stride 1: the last pair is never combined",
           "for (int stride = THREADS / 2; stride > 0;", "for (int stride = THREADS / 2; stride > 1;",
           hint="the reduction stops one step early"),
    Mutant("w33.block_softmax", "each thread returns its own partial instead of the block's result",
           "    float result = smem[0];", "    float result = smem[tid];", hint="each thread kept its own partial"),
    # warp_softmax (CUDA C shuffles)
    Mutant("w33.warp_softmax", "max butterfly starts at offset 8: lanes 0-15 never see lanes 16-31",
           "for (int offset = 16; offset > 0; offset >>= 1)\n        v = fmaxf(",
           "for (int offset = 8; offset > 0; offset >>= 1)\n        v = fmaxf(",
           hint="the max butterfly starts at offset 8"),
    Mutant("w33.warp_softmax", "sum reduction takes the max (copy-paste)",
           "        v += __shfl_xor_sync(0xffffffffu, v, offset);",
           "        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));",
           hint="the sum reduction combines with fmaxf"),
    Mutant("w33.warp_softmax", "sum butterfly stops before offset 1",
           "for (int offset = 16; offset > 0; offset >>= 1)\n        v +=",
           "for (int offset = 16; offset > 1; offset >>= 1)\n        v +=",
           hint="the sum butterfly stops before offset 1"),
    # triton_softmax
    Mutant("w33.triton_softmax", "max added to lse twice: log of the unshifted sum, plus the max",
           "log_sum = tl.log(tl.sum(tl.exp(x.to(tl.float32) - x_max), axis=0))",
           "log_sum = tl.log(tl.sum(tl.exp(x.to(tl.float32)), axis=0))", hint="the max is counted twice"),
    Mutant("w33.triton_softmax", "padding lanes load 0 instead of -inf, so they join the max and the sum",
           'mask=mask, other=-float("inf"))\n    x_max', "mask=mask, other=0.0)\n    x_max",
           hint="the padding lanes past the row's end count as logits of 0"),
    Mutant("w33.triton_softmax", "forgot to normalise by the row sum: exp(x - max) instead of exp(x - lse)",
           "y = tl.exp(x.to(tl.float32) - lse - lse_error)", "y = tl.exp(x.to(tl.float32) - x_max)",
           hint="exp(x - max) was not divided by the row's sum"),
    Mutant("w33.triton_softmax", "lse rounded to float32 at the scale of the max: 4e-4 off on logits of 1e4",
           "y = tl.exp(x.to(tl.float32) - lse - lse_error)", "y = tl.exp(x.to(tl.float32) - lse)",
           hint="lse = max + log Σ exp(x - max) is rounded to float32"),
    Mutant("w33.triton_softmax", "row sum accumulated in float16 (the exponentials cast to the input dtype)",
           "log_sum = tl.log(tl.sum(tl.exp(x.to(tl.float32) - x_max), axis=0))",
           "log_sum = tl.log(tl.sum(tl.exp(x.to(tl.float32) - x_max).to(x.dtype), axis=0).to(tl.float32))",
           hint="the row sum is accumulated in float16"),
    Mutant("w33.triton_softmax", "unmasked load: the last row reads past the end of x",
           'x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))\n    x_max',
           "x = tl.load(x_ptr + row * n_cols + cols)\n    x_max", hint="mask the load"),
    # online_softmax_update
    Mutant("w33.online_softmax_update", "old sum not rescaled when the max grows",
           "l_new = l * np.exp(m - shift) + ", "l_new = l + ", hint="the old sum is not rescaled"),
    Mutant("w33.online_softmax_update", "no guard for empty rows: exp(-inf - (-inf)) is NaN",
           "shift = np.where(np.isneginf(m_new), 0.0, m_new)", "shift = m_new", hint="NaN for an empty row"),
    Mutant("w33.online_softmax_update", "new terms not shifted by the new max",
           "np.exp(chunk - shift[:, None]).sum(axis=-1)", "np.exp(chunk).sum(axis=-1)",
           hint="the new terms are not shifted"),
    Mutant("w33.online_softmax_update", "rescale factor inverted: exp(m_new - m_old)",
           "l * np.exp(m - shift)", "l * np.exp(shift - m)", hint="the rescale factor is inverted"),
    Mutant("w33.online_softmax_update", "new terms shifted by the old max",
           "np.exp(chunk - shift[:, None]).sum(axis=-1)", "np.exp(chunk - m[:, None]).sum(axis=-1)",
           hint="the new terms are shifted by the old max"),
    Mutant("w33.online_softmax_update", "the running max ignored: the new max is the chunk's alone",
           "m_new = np.maximum(m, chunk.max(axis=-1))", "m_new = chunk.max(axis=-1)",
           hint="the larger of the running max and the new values' max"),
    # merge_softmax_states
    Mutant("w33.merge_softmax_states", "the left state's sum is not rescaled",
           "l_a * np.exp(m_a - shift)", "l_a", hint="the left state's sum is not rescaled"),
    Mutant("w33.merge_softmax_states", "min instead of max: exp overflows",
           "m = np.maximum(m_a, m_b)", "m = np.minimum(m_a, m_b)", hint="not the smaller"),
    Mutant("w33.merge_softmax_states", "no guard for two empty states: NaN",
           "shift = np.where(np.isneginf(m), 0.0, m)", "shift = m", hint="NaN for an empty row"),
    Mutant("w33.merge_softmax_states", "neither sum rescaled",
           "l_a * np.exp(m_a - shift) + l_b * np.exp(m_b - shift)", "l_a + l_b", hint="the old sum is not rescaled"),
    # online_softmax (looped Triton)
    Mutant("w33.online_softmax", "accumulated sum not rescaled when a group's max grows",
           "l = l * tl.exp(m - m_new) + ", "l = l + ", hint="the running sum is not rescaled"),
    Mutant("w33.online_softmax", "running max initialised to 0",
           "m = tl.full([BLOCK // 8], -1.0e38, tl.float32)", "m = tl.full([BLOCK // 8], 0.0, tl.float32)",
           hint="the running max starts at 0"),
    Mutant("w33.online_softmax", "running max never updated",
           "        m = m_new\n", "", hint="the running max is never updated"),
    Mutant("w33.online_softmax", "new terms shifted by the old max, not the new one: exp overflows",
           "tl.exp(x - m_new[:, None])", "tl.exp(x - m[:, None])", hint="the new terms are shifted by the old max"),
    Mutant("w33.online_softmax", "running max initialised to -inf with no guard: exp(-inf - (-inf)) is NaN",
           "m = tl.full([BLOCK // 8], -1.0e38, tl.float32)", 'm = tl.full([BLOCK // 8], -float("inf"), tl.float32)',
           hint="the running max starts at -inf"),
    Mutant("w33.online_softmax", "row sum accumulated in float16",
           "inv_sum = 1.0 / tl.sum(l * tl.exp(m - m_row), axis=0)",
           "inv_sum = 1.0 / tl.sum((l * tl.exp(m - m_row)).to(y_ptr.dtype.element_ty), axis=0)",
           hint="the row sum is accumulated in float16"),
    # log_softmax
    Mutant("w33.log_softmax", "missing max-subtraction: exp overflows on huge logits",
           "shifted = x - tl.max(x, axis=0)", "shifted = x", hint="Subtract each row's max first"),
    Mutant("w33.log_softmax", "log of the softmax: underflows to -inf for large gaps",
           "y = shifted - tl.log(tl.sum(tl.exp(shifted), axis=0))",
           "y = tl.log(tl.exp(shifted) / tl.sum(tl.exp(shifted), axis=0))", hint="log(softmax) underflows"),
    Mutant("w33.log_softmax", "padding lanes load 0 instead of -inf, so they join the max and the sum",
           'other=-float("inf")).to(tl.float32)\n    shifted', "other=0.0).to(tl.float32)\n    shifted",
           hint="the padding lanes past the row's end count as logits of 0"),
    Mutant("w33.log_softmax", "row sum accumulated in float16 (the exponentials cast to the input dtype)",
           "y = shifted - tl.log(tl.sum(tl.exp(shifted), axis=0))",
           "y = shifted - tl.log(tl.sum(tl.exp(shifted).to(x_ptr.dtype.element_ty), axis=0).to(tl.float32))",
           hint="the row sum is accumulated in float16"),
    Mutant("w33.log_softmax", "log-sum-exp left out: y = x - max",
           "y = shifted - tl.log(tl.sum(tl.exp(shifted), axis=0))", "y = shifted",
           hint="subtract log Σ exp(x - max) as well"),
]

# Correct solutions written another way: the graders must accept them.
VARIANTS = [
    Variant("w33.stable_softmax", "float64 inside, the result cast back to the input's dtype",
            "    shifted = x - x.max(axis=-1, keepdims=True)\n    e = np.exp(shifted)\n"
            "    return e / e.sum(axis=-1, keepdims=True)",
            "    wide = x.astype(np.float64)\n    e = np.exp(wide - wide.max(axis=-1, keepdims=True))\n"
            "    return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)"),
    Variant("w33.online_softmax_update", "log-domain: the sums combined as log-sum-exp",
            "    l_new = l * np.exp(m - shift) + np.exp(chunk - shift[:, None]).sum(axis=-1)",
            "    with np.errstate(divide=\"ignore\"):\n"
            "        log_old = np.log(l) + (m - shift)\n"
            "        log_new = np.log(np.exp(chunk - shift[:, None]).sum(axis=-1))\n"
            "    l_new = np.exp(np.logaddexp(log_old, log_new))"),
    Variant("w33.merge_softmax_states", "log-domain: log l_a + m_a and log l_b + m_b combined with logaddexp",
            "    return m, l_a * np.exp(m_a - shift) + l_b * np.exp(m_b - shift)",
            "    with np.errstate(divide=\"ignore\"):\n"
            "        both = np.logaddexp(np.log(l_a) + (m_a - shift), np.log(l_b) + (m_b - shift))\n"
            "    return m, np.exp(both)"),
    # The first loop keeps an element-wise max and reduces it after the loop: with a float32 reduction into a
    # loop-carried value in both loops, Triton 3.6's compiler fails (pass TritonGPUOptimizeThreadLocality) at BLOCK
    # 8192, 16 warps and a row length divisible by 16; Triton 3.9 compiles either form.
    Variant("w33.online_softmax", "two passes instead of online: every group's max first, then the sums",
            "    for start in tl.range(0, n_cols, BLOCK, num_stages=STAGES):\n"
            "        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=-float(\"inf\")).to(tl.float32)\n"
            "        ### BEGIN SOLUTION\n"
            "        m_new = tl.maximum(m, tl.max(x, axis=1))\n"
            "        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)\n"
            "        m = m_new\n",
            "    top = tl.full([BLOCK // 8, 8], -1.0e38, tl.float32)\n"
            "    for start in tl.range(0, n_cols, BLOCK):\n"
            "        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=-float(\"inf\")).to(tl.float32)\n"
            "        top = tl.maximum(top, x)\n"
            "    m = tl.maximum(m, tl.max(top, axis=1))\n"
            "    for start in tl.range(0, n_cols, BLOCK):\n"
            "        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=-float(\"inf\")).to(tl.float32)\n"
            "        ### BEGIN SOLUTION\n"
            "        l += tl.sum(tl.exp(x - m[:, None]), axis=1)\n"),
    Variant("w33.online_softmax", "blocks of 64 columns, one warp",
            "block = block or min(row_block(n_cols), 8192)", "block = block or 64"),
    Variant("w33.log_softmax", "float64 arithmetic in the kernel, cast at the store",
            "    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float(\"inf\")).to(tl.float32)\n"
            "    shifted",
            "    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float(\"inf\")).to(tl.float64)\n"
            "    shifted"),
]
