"""Wrong solutions of week 34 that the graders must reject (see course/mutants.py for the format)."""
from course.mutants import Mutant

MUTANTS = [
    # welford_variance
    Mutant("w34.welford_variance", "E[x²] - E[x]²: cancels catastrophically on rows with a large offset",
           "        m2 = m2 + delta * (value - mean)\n        ### END SOLUTION\n    return mean, m2 / count",
           "        m2 = m2 + value * value\n        ### END SOLUTION\n    return mean, m2 / count - mean * mean"),
    Mutant("w34.welford_variance", "unbiased variance (M2 / (n - 1)) where LayerNorm uses the population variance",
           "    return mean, m2 / count", "    return mean, m2 / max(count - 1, 1)"),
    Mutant("w34.welford_variance", "M2 updated with the old mean twice (delta²)",
           "m2 = m2 + delta * (value - mean)", "m2 = m2 + delta * delta"),
    Mutant("w34.welford_variance", "mean updated with the count before the increment",
           "mean = mean + delta / count", "mean = mean + delta / (count + 1)"),
    # chan_merge
    Mutant("w34.chan_merge", "the δ² term is dropped: M2 of the union is not the sum of the parts' M2",
           "m2 = m2_a + m2_b + delta * delta * n_a * share_b", "m2 = m2_a + m2_b"),
    Mutant("w34.chan_merge", "means averaged without weighting by the counts",
           "mean = mean_a + delta * share_b", "mean = (mean_a + mean_b) / 2"),
    Mutant("w34.chan_merge", "δ² weighted by n_b / n instead of n_a·n_b / n",
           "delta * delta * n_a * share_b", "delta * delta * share_b"),
    Mutant("w34.chan_merge", "no guard for two empty parts: 0 / 0 is NaN",
           "share_b = n_b / np.where(n == 0, 1, n)", "share_b = n_b / n"),
    # cuda_layernorm
    Mutant("w34.cuda_layernorm", "eps outside the square root", "rsqrtf(s.m2 / s.n + eps)", "(rsqrtf(s.m2 / s.n) + eps)"),
    Mutant("w34.cuda_layernorm", "unbiased variance (M2 / (n - 1))", "rsqrtf(s.m2 / s.n + eps)",
           "rsqrtf(s.m2 / fmaxf(s.n - 1.f, 1.f) + eps)"),
    Mutant("w34.cuda_layernorm", "merge drops the δ² term of Chan's formula",
           "a.m2 + b.m2 + delta * delta * a.n * share_b", "a.m2 + b.m2"),
    Mutant("w34.cuda_layernorm", "bias not added", " * to_float(weight[j]) + to_float(bias[j]))", " * to_float(weight[j]))"),
    # rmsnorm
    Mutant("w34.rmsnorm", "eps outside the square root",
           "rstd = 1.0 / tl.sqrt(tl.sum(x.to(COMPUTE) * x.to(COMPUTE), axis=0) / n_cols + eps)",
           "rstd = 1.0 / tl.sqrt(tl.sum(x.to(COMPUTE) * x.to(COMPUTE), axis=0) / n_cols) + eps"),
    Mutant("w34.rmsnorm", "mean of squares over the padded block, not the row",
           "tl.sum(x.to(COMPUTE) * x.to(COMPUTE), axis=0) / n_cols + eps", "tl.sum(x.to(COMPUTE) * x.to(COMPUTE), axis=0) / BLOCK + eps"),
    Mutant("w34.rmsnorm", "weight not applied",
           "(x.to(COMPUTE) * rstd * w).to(y_ptr.dtype.element_ty)", "(x.to(COMPUTE) * rstd).to(y_ptr.dtype.element_ty)"),
    Mutant("w34.rmsnorm", "rstd not saved for the backward pass", "    tl.store(rstd_ptr + row, rstd)\n    ### END SOLUTION",
           "    ### END SOLUTION"),
    # layernorm_dx
    Mutant("w34.layernorm_dx", "the mean(w·dy) term is missing (RMSNorm's formula used for LayerNorm)",
           "dx = (wdy - (xhat * c1 + c2)) * rstd", "dx = (wdy - xhat * c1) * rstd"),
    Mutant("w34.layernorm_dx", "the xhat·mean(xhat·w·dy) term is missing",
           "dx = (wdy - (xhat * c1 + c2)) * rstd", "dx = (wdy - c2) * rstd"),
    Mutant("w34.layernorm_dx", "not multiplied by rstd", "dx = (wdy - (xhat * c1 + c2)) * rstd", "dx = wdy - (xhat * c1 + c2)"),
    Mutant("w34.layernorm_dx", "c2 summed over dy instead of w·dy", "c2 = tl.sum(wdy, axis=0) / n_cols",
           "c2 = tl.sum(wdy / tl.where(wdy == 0, 1.0, wdy), axis=0) / n_cols"),
    # norm_weight_grad
    Mutant("w34.norm_weight_grad", "last partial row skipped (parts < n_parts - 1)",
           "mask = (parts[:, None] < n_parts) &", "mask = (parts[:, None] < n_parts - 1) &"),
    Mutant("w34.norm_weight_grad", "partials read with the block's stride instead of the row length",
           "part_ptr + parts[:, None] * n_cols + cols[None, :]", "part_ptr + parts[:, None] * BLOCK_N + cols[None, :]"),
    Mutant("w34.norm_weight_grad", "only the first BLOCK_P parts are summed",
           "for start in range(0, n_parts, BLOCK_P):", "for start in range(0, BLOCK_P, BLOCK_P):"),
    # fused_add_rmsnorm
    Mutant("w34.fused_add_rmsnorm", "residual not returned: h is never stored",
           "    tl.store(h_ptr + offsets, h, mask=mask)\n", ""),
    Mutant("w34.fused_add_rmsnorm", "normalises x instead of x + residual",
           "(h.to(COMPUTE) * rstd * w)", "(x.to(COMPUTE) * rstd * w)"),
    Mutant("w34.fused_add_rmsnorm", "eps outside the square root",
           "tl.sum(h.to(COMPUTE) * h.to(COMPUTE), axis=0) / n_cols + eps)",
           "tl.sum(h.to(COMPUTE) * h.to(COMPUTE), axis=0) / n_cols) + eps"),
]
