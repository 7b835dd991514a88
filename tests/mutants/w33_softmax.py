"""Wrong solutions of week 33 that the graders must reject (see course/mutants.py for the format)."""
from course.mutants import Mutant

MUTANTS = [
    # stable_softmax
    Mutant("w33.stable_softmax", "missing max-subtraction: exp overflows on huge logits",
           "    shifted = x - x.max(axis=-1, keepdims=True)\n    e = np.exp(shifted)", "    e = np.exp(x)"),
    Mutant("w33.stable_softmax", "normalised by the sum of the whole array, not of each row",
           "e / e.sum(axis=-1, keepdims=True)", "e / e.sum()"),
    Mutant("w33.stable_softmax", "max taken over the wrong axis",
           "x.max(axis=-1, keepdims=True)", "x.max(axis=0, keepdims=True)"),
    # block_softmax (CUDA C shared-memory tree)
    Mutant("w33.block_softmax", "tree starts at THREADS/4: half the threads' values are dropped",
           "for (int stride = THREADS / 2; stride > 0;", "for (int stride = THREADS / 4; stride > 0;"),
    Mutant("w33.block_softmax", "tree stops before stride 1: the last pair is never combined",
           "for (int stride = THREADS / 2; stride > 0;", "for (int stride = THREADS / 2; stride > 1;"),
    Mutant("w33.block_softmax", "each thread returns its own partial instead of the block's result",
           "    float result = smem[0];", "    float result = smem[tid];"),
    # warp_softmax (CUDA C shuffles)
    Mutant("w33.warp_softmax", "max butterfly starts at offset 8: lanes 0-15 never see lanes 16-31",
           "for (int offset = 16; offset > 0; offset >>= 1)\n        v = fmaxf(",
           "for (int offset = 8; offset > 0; offset >>= 1)\n        v = fmaxf("),
    Mutant("w33.warp_softmax", "sum reduction takes the max (copy-paste)",
           "        v += __shfl_xor_sync(0xffffffffu, v, offset);",
           "        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));"),
    Mutant("w33.warp_softmax", "sum butterfly stops before offset 1",
           "for (int offset = 16; offset > 0; offset >>= 1)\n        v +=",
           "for (int offset = 16; offset > 1; offset >>= 1)\n        v +="),
    # triton_softmax
    Mutant("w33.triton_softmax", "missing max-subtraction: exp overflows on huge logits",
           "    x = x - tl.max(x, axis=0)\n    e = tl.exp(x)", "    e = tl.exp(x)"),
    Mutant("w33.triton_softmax", "padding lanes load 0 instead of -inf, so they join the sum",
           'other=-float("inf")).to(tl.float32)\n    x = x - tl.max(x, axis=0)',
           "other=0.0).to(tl.float32)\n    x = x - tl.max(x, axis=0)"),
    Mutant("w33.triton_softmax", "forgot to normalise by the row sum",
           "    y = e / tl.sum(e, axis=0)\n", "    y = e\n"),
    # online_softmax_update
    Mutant("w33.online_softmax_update", "old sum not rescaled when the max grows",
           "l_new = l * np.exp(m - shift) + ", "l_new = l + "),
    Mutant("w33.online_softmax_update", "no guard for empty rows: exp(-inf - (-inf)) is NaN",
           "shift = np.where(np.isneginf(m_new), 0.0, m_new)", "shift = m_new"),
    Mutant("w33.online_softmax_update", "new terms not shifted by the new max",
           "np.exp(chunk - shift[:, None]).sum(axis=-1)", "np.exp(chunk).sum(axis=-1)"),
    Mutant("w33.online_softmax_update", "rescale factor inverted: exp(m_new - m_old)",
           "l * np.exp(m - shift)", "l * np.exp(shift - m)"),
    # merge_softmax_states
    Mutant("w33.merge_softmax_states", "the left state's sum is not rescaled",
           "l_a * np.exp(m_a - shift)", "l_a"),
    Mutant("w33.merge_softmax_states", "min instead of max: exp overflows",
           "m = np.maximum(m_a, m_b)", "m = np.minimum(m_a, m_b)"),
    Mutant("w33.merge_softmax_states", "no guard for two empty states: NaN",
           "shift = np.where(np.isneginf(m), 0.0, m)", "shift = m"),
    # online_softmax (looped Triton)
    Mutant("w33.online_softmax", "accumulated sum not rescaled when a lane's max grows",
           "l = tl.where(x > m, l * e + 1.0, l + e)", "l = tl.where(x > m, l + 1.0, l + e)"),
    Mutant("w33.online_softmax", "running max initialised to 0",
           "m = tl.full([BLOCK], -3.0e38, tl.float32)", "m = tl.full([BLOCK], 0.0, tl.float32)"),
    Mutant("w33.online_softmax", "running max never updated",
           "        m = tl.maximum(m, x)\n", ""),
    # log_softmax
    Mutant("w33.log_softmax", "missing max-subtraction: exp overflows on huge logits",
           "shifted = x - tl.max(x, axis=0)", "shifted = x"),
    Mutant("w33.log_softmax", "log of the softmax: underflows to -inf for large gaps",
           "y = shifted - tl.log(tl.sum(tl.exp(shifted), axis=0))",
           "y = tl.log(tl.exp(shifted) / tl.sum(tl.exp(shifted), axis=0))"),
    Mutant("w33.log_softmax", "padding lanes load 0 instead of -inf, so they join the max and the sum",
           'other=-float("inf")).to(tl.float32)\n    shifted', "other=0.0).to(tl.float32)\n    shifted"),
]
