"""Wrong solutions of week 38 that the graders must reject, each with words its hint must contain
(see course/mutants.py for the format)."""
from course.mutants import Mutant, Variant

MUTANTS = [
    # tiled_attention_backward (NumPy)
    Mutant("w38.tiled_attention_backward", "dS without subtracting D",
           "ds = p * (do[z][rows] @ v[z][cols].T - big_d[z][rows][:, None])", "ds = p * (do[z][rows] @ v[z][cols].T)",
           hint="D = rowsum(dO ∘ O) was not subtracted"),
    Mutant("w38.tiled_attention_backward", "D computed from dO·V instead of dO·O", "big_d = (do * o).sum(axis=-1)",
           "big_d = (do * v).sum(axis=-1)", hint="computed from dO ∘ V"),
    Mutant("w38.tiled_attention_backward", "missing scale on dQ", "dq[z][rows] += scale * ds @ k[z][cols]",
           "dq[z][rows] += ds @ k[z][cols]", hint="scale 1/√d is missing"),
    Mutant("w38.tiled_attention_backward", "LSE not used: P recomputed as exp(S)", "p = np.exp(s - lse[z][rows][:, None])",
           "p = np.exp(s)", hint="without the log-sum-exp"),
    Mutant("w38.tiled_attention_backward", "causal mask off by one in backward: the diagonal is masked",
           "s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)\n                p =",
           "s = np.where(cols[None, :] < rows[:, None], s, -np.inf)\n                p =", hint="diagonal was masked"),
    # attention_delta (Triton)
    Mutant("w38.attention_delta", "D = rowsum(O ∘ O)", "delta = tl.sum(o * do, axis=1)", "delta = tl.sum(o * o, axis=1)",
           hint="not rowsum(O ∘ O)"),
    Mutant("w38.attention_delta", "D = rowsum(O) · rowsum(dO)", "delta = tl.sum(o * do, axis=1)",
           "delta = tl.sum(o, axis=1) * tl.sum(do, axis=1)", hint="not the product of the two sums"),
    Mutant("w38.attention_delta", "D scaled by 1/√d", "delta = tl.sum(o * do, axis=1)",
           "delta = tl.sum(o * do, axis=1) / tl.sqrt(D * 1.0)", hint="D has no softmax scale"),
    # flash_dkdv (Triton)
    Mutant("w38.flash_dkdv", "dS without subtracting D", "ds_t = p_t * (dp_t - delta[None, :])", "ds_t = p_t * dp_t",
           hint="D = rowsum(dO ∘ O) was not subtracted"),
    Mutant("w38.flash_dkdv", "LSE not used: P recomputed as exp(S)",
           "p_t = tl.exp2(tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale - lse[None, :])",
           "p_t = tl.exp2(tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale)", hint="without the log-sum-exp"),
    Mutant("w38.flash_dkdv", "causal mask off by one in backward: the diagonal is masked",
           "p_t = tl.where(cols[:, None] <= rows[None, :], p_t, 0.0)", "p_t = tl.where(cols[:, None] < rows[None, :], p_t, 0.0)",
           hint="diagonal was masked"),
    Mutant("w38.flash_dkdv", "missing scale on dK", "tl.store(dk_ptr + out, (dk * sm_scale)", "tl.store(dk_ptr + out, (dk)",
           hint="scale 1/√d is missing"),
    Mutant("w38.flash_dkdv", "grouped-query dK/dV not summed over the group: each query head overwrites them",
           "        q_head = q_ptr + batch * sqb + h * sqh + first * sqm\n        do_head",
           "        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)\n        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)\n"
           "        q_head = q_ptr + batch * sqb + h * sqh + first * sqm\n        do_head",
           hint="not the sum over the heads of the group"),
    # flash_dq (Triton)
    Mutant("w38.flash_dq", "dS without subtracting D",
           "ds = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])",
           "ds = p * tl.dot(do, tl.trans(v), input_precision=PRECISION)", hint="D = rowsum(dO ∘ O) was not subtracted"),
    Mutant("w38.flash_dq", "causal mask off by one in backward: the diagonal is masked",
           "keep = keep & (cols[None, :] <= rows[:, None])\n            p = tl.where(keep, p, 0.0)",
           "keep = keep & (cols[None, :] < rows[:, None])\n            p = tl.where(keep, p, 0.0)",
           hint="diagonal was masked"),
    Mutant("w38.flash_dq", "missing scale on dQ", "(dq * sm_scale).to(", "(dq).to(", hint="scale 1/√d is missing"),
    Mutant("w38.flash_dq", "LSE not used: P recomputed as exp(S)",
           "p = tl.exp2(tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale - lse[:, None])",
           "p = tl.exp2(tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale)", hint="without the log-sum-exp"),
    # flash_forward: the grouped-query head mapping
    Mutant("w38.flash_forward", "GQA head index h % Hkv (interleaved groups)", "kvh = h // group", "kvh = h % HKV",
           hint="interleaved"),
    Mutant("w38.flash_forward", "every query head reads key/value head 0", "kvh = h // group", "kvh = h * 0",
           hint="multi-query"),
    Mutant("w38.flash_forward", "GQA head index h instead of h // group", "kvh = h // group", "kvh = h",
           needs_gpu=True),
    # merge_splits (NumPy)
    Mutant("w38.merge_splits", "split states merged without rescaling: plain average",
           "o = (weights[..., None] * o_parts).sum(axis=0) / safe[..., None]", "o = o_parts.mean(axis=0)",
           hint="averaged"),
    Mutant("w38.merge_splits", "no max subtraction: exp(lse) overflows", "shift = np.where(np.isfinite(top), top, 0.0)",
           "shift = np.zeros_like(top)", hint="overflows"),
    Mutant("w38.merge_splits", "merged lse taken as the largest part's",
           "lse = np.where(total > 0, shift + np.log(safe), -np.inf)", "lse = top", hint="largest part's"),
    Mutant("w38.merge_splits", "NaN on a row no split saw", "shift = np.where(np.isfinite(top), top, 0.0)",
           "shift = top", hint="NaN"),
    # tc_flash_attention (CUDA C, tensor cores)
    Mutant("w38.tc_flash_attention", "no causal mask", "if (masked && (col >= N || (causal && col > row))) x = -INFINITY;",
           "if (masked && col >= N) x = -INFINITY;", hint="no causal mask"),
    Mutant("w38.tc_flash_attention", "causal mask off by one: the diagonal is masked",
           "if (masked && (col >= N || (causal && col > row))) x = -INFINITY;",
           "if (masked && (col >= N || (causal && col >= row))) x = -INFINITY;", hint="diagonal was masked"),
    Mutant("w38.tc_flash_attention", "accumulator not rescaled", "acc[n][e] *= alpha[e / 2];", "acc[n][e] *= 1.f;",
           hint="rescale"),
    Mutant("w38.tc_flash_attention", "l not rescaled", "l_i[r] = l_i[r] * alpha[r] + sum[r];",
           "l_i[r] = l_i[r] + sum[r];", hint="rescale"),
    Mutant("w38.tc_flash_attention", "scale missing", "float x = s[n][e] * qk_scale;",
           "float x = s[n][e] * 1.4426950408889634f;", hint="scale 1/√d is missing"),
    Mutant("w38.tc_flash_attention", "a race: no barrier between the copies landing and the tile's use",
           "        __syncthreads();      // ... everyone's; and every warp",
           "        // ... everyone's; and every warp", needs_gpu=True, hint="race"),
]

# Correct solutions written another way: the graders must accept them.
VARIANTS = [
    Variant("w38.flash_forward", "other tiles: query blocks narrower than key blocks",
            "CPU_TILES = (32, 32, 4, 1)\nTUNE_FROM = 1024\nFORWARD_CONFIGS = [(64, 64, 4, 3),",
            "CPU_TILES = (16, 64, 4, 1)\nTUNE_FROM = 1024\nFORWARD_CONFIGS = [(32, 128, 4, 2),"),
]
