"""Wrong solutions of week 40 that the graders must reject, each with words its hint must contain
(see course/mutants.py for the format)."""
from course.mutants import Mutant, Variant  # noqa: F401

# ---------------------------------------------------------------- day 1: layout_index
LAYOUT_MUTANTS = [
    Mutant("w40.layout_index", "row-major order: the last mode varies fastest instead of the first",
           "for extent, step in zip(extents, steps):", "for extent, step in reversed(list(zip(extents, steps))):",
           hint="the last mode varies fastest here"),
    Mutant("w40.layout_index", "the modes inside a nested mode walked last-fastest (inner order reversed)",
           "for x in flat(mode)]", "for x in flat(mode)[::-1]]",
           hint="the modes inside a nested mode are walked last-fastest"),
    Mutant("w40.layout_index", "strides paired with the wrong modes (the flat strides reversed)",
           "zip(extents, steps)", "zip(extents, steps[::-1])",
           hint="a mode's coordinate is multiplied by another mode's stride"),
    Mutant("w40.layout_index", "a nested mode taken as one mode of its whole size, with its first stride",
           "extents, steps = flat(shape), flat(stride)",
           "tops = list(zip(shape, stride)) if isinstance(shape, tuple) else [(shape, stride)]\n"
           "    extents, steps = [math.prod(flat(s)) for s, _ in tops], [flat(d)[0] for _, d in tops]",
           hint="a nested mode was used as one mode of its whole size"),
    Mutant("w40.layout_index", "the index never divided: every mode takes index % extent of the whole index",
           "        index = index // extent\n", "",
           hint="every mode took its coordinate from the whole index"),
]

# ---------------------------------------------------------------- day 3: chunk_recurrence, causal_linear_attention
_CHUNK_BODY = ("        states[..., c, :, :], norms[..., c, :] = state, norm\n"
               "        keys, values = phi_k[..., c * chunk:(c + 1) * chunk, :], v[..., c * chunk:(c + 1) * chunk, :]\n"
               "        state = state + np.swapaxes(keys, -1, -2) @ values\n"
               "        norm = norm + keys.sum(axis=-2)\n")
LINEAR_MUTANTS = [
    Mutant("w40.chunk_recurrence", "the state stored after adding the chunk (inclusive prefix)", _CHUNK_BODY,
           _CHUNK_BODY.split("\n", 1)[1] + "        states[..., c, :, :], norms[..., c, :] = state, norm\n",
           hint="already holds chunk c"),
    Mutant("w40.chunk_recurrence", "only the previous chunk kept (no running sum)",
           "state = state + np.swapaxes(keys, -1, -2) @ values\n        norm = norm + keys.sum(axis=-2)",
           "state = np.swapaxes(keys, -1, -2) @ values\n        norm = keys.sum(axis=-2)", hint="keep a running total"),
    Mutant("w40.chunk_recurrence", "chunk boundaries shifted by one position",
           "phi_k[..., c * chunk:(c + 1) * chunk, :], v[..., c * chunk:(c + 1) * chunk, :]",
           "phi_k[..., c * chunk + 1:(c + 1) * chunk + 1, :], v[..., c * chunk + 1:(c + 1) * chunk + 1, :]",
           hint="a boundary is off"),
    Mutant("w40.chunk_recurrence", "the normaliser never accumulated", "norm = norm + keys.sum(axis=-2)",
           "norm = norm", hint="the normaliser z_c"),
    Mutant("w40.causal_linear_attention", "the diagonal masked out (j < i)", "tl.where(pos[None, :] <= pos[:, None], a",
           "tl.where(pos[None, :] < pos[:, None], a", hint="the diagonal is masked out"),
    Mutant("w40.causal_linear_attention", "no causal mask inside the chunk",
           "    a = tl.where(pos[None, :] <= pos[:, None], a, 0.0)  # causal inside the chunk: key j <= query i\n", "",
           hint="later keys leak in"),
    Mutant("w40.causal_linear_attention", "the state left out of the numerator",
           "    num += tl.dot(phi_q.to(v.dtype), state.to(v.dtype), input_precision=PRECISION)  # every earlier chunk "
           "at once\n", "", hint="the numerator leaves out the earlier chunks"),
    Mutant("w40.causal_linear_attention", "the normaliser without the carried z",
           " + tl.sum(phi_q * norm[None, :], axis=1) + eps", " + eps", hint="the normaliser leaves out the earlier"),
    Mutant("w40.causal_linear_attention", "no normalisation", "o = num / den[:, None]", "o = num",
           hint="not normalised"),
    Mutant("w40.causal_linear_attention", "the normaliser without the chunk's own weights",
           "den = tl.sum(a, axis=1) + ", "den = ", hint="leaves out the chunk's own weights"),
]

# ---------------------------------------------------------------- day 4: block_tile_list
_SPLIT = "partial, full = (kept > 0) & (kept < block_m * block_n), kept == block_m * block_n"
SPARSE_MUTANTS = [
    Mutant("w40.block_tile_list", "every visited tile listed as partial (no full list)", _SPLIT,
           "partial, full = kept > 0, kept < 0", hint="full tiles go in the full list"),
    Mutant("w40.block_tile_list", "partial tiles dropped", _SPLIT, "partial, full = kept < 0, kept == block_m * block_n",
           hint="tiles with only some pairs kept are missing"),
    Mutant("w40.block_tile_list", "pairs past the edge counted as kept (edge tiles called full)",
           "padded = np.zeros((tm * block_m, tn * block_n), dtype=bool)",
           "padded = np.ones((tm * block_m, tn * block_n), dtype=bool)", hint="runs past M or N"),
    Mutant("w40.block_tile_list", "tiles listed in descending order", "tiles = np.flatnonzero(listed[r])",
           "tiles = np.flatnonzero(listed[r])[::-1]", hint="ascending order"),
    Mutant("w40.block_tile_list", "empty tiles listed as partial", "(kept > 0) & (kept < block_m * block_n)",
           "(kept < block_m * block_n)", hint="a tile with no kept pair is listed"),
]

# ---------------------------------------------------------------- day 6: capstone_block
CAPSTONE_MUTANTS = [
    Mutant("w40.capstone_block", "RoPE applied to v too", "q, k = Rotary.apply(q, cos, sin), Rotary.apply(k, cos, sin)",
           "q, k, v = Rotary.apply(q, cos, sin), Rotary.apply(k, cos, sin), Rotary.apply(v, cos, sin)",
           hint="v is rotated too"),
    Mutant("w40.capstone_block", "gate and up swapped", "gate, up = y @ w_gate_up[:f].T, y @ w_gate_up[f:].T",
           "up, gate = y @ w_gate_up[:f].T, y @ w_gate_up[f:].T", hint="gate and up are swapped"),
    Mutant("w40.capstone_block", "attention without the causal mask", "flash_attn, causal=True)",
           "flash_attn, causal=False)", hint="not causal"),
    Mutant("w40.capstone_block", "q, k, v split head-major (view (B, N, H, 3, d))",
           ".view(bsz, n, 3, n_heads, d).permute(2, 0, 3, 1, 4).unbind(0)\n    q, k = Rotary",
           ".view(bsz, n, n_heads, 3, d).permute(3, 0, 2, 1, 4).unbind(0)\n    q, k = Rotary",
           hint="split the wrong way"),
    Mutant("w40.capstone_block", "the MLP's norm reads x instead of the residual stream h",
           "y, h = DropoutResidualRMSNorm.apply(mixed, x, w_norm2, p, seed, 0)",
           "_, h = DropoutResidualRMSNorm.apply(mixed, x, w_norm2, p, seed, 0)\n"
           "    y = course.kernels(W34).RMSNormFunction.apply(x, w_norm2)", hint="the MLP's norm reads x"),
    Mutant("w40.capstone_block", "the MLP's residual add missing", "out = DropoutResidual.apply(mlp, h, p, seed, x.numel())",
           "out = mlp", hint="a residual add is missing"),
    Mutant("w40.capstone_block", "the output projection untransposed", ".reshape(bsz, n, c) @ w_o.T",
           ".reshape(bsz, n, c) @ w_o", hint="untransposed"),
]

# ---------------------------------------------------------------- day 2: kernel_facts
_WGMMA = 'wgmma = instructions("wgmma.mma_async")'
_WARPS = 'warps = attributes["ttg.num-warps"]'
COMPILER_MUTANTS = [
    Mutant("w40.kernel_facts", "every wgmma line counted (fence, commit_group and wait_group with the MMAs)",
           _WGMMA, 'wgmma = instructions("wgmma")', hint="every wgmma line was counted"),
    Mutant("w40.kernel_facts", "the TTGIR's warp_group_dot ops counted instead of the PTX's wgmma instructions",
           _WGMMA, r'wgmma = len(re.findall(r"ttng\.warp_group_dot\b", ttgir))',
           hint="the TTGIR's ttng.warp_group_dot ops were counted"),
    Mutant("w40.kernel_facts", "exp2 counted in the TTGIR (one math.exp2 per tile) instead of the PTX",
           'ex2 = instructions("ex2.approx")', 'ex2 = ttgir.count("math.exp2")',
           hint="the TTGIR's math.exp2 ops were counted"),
    Mutant("w40.kernel_facts", "shared memory reported in kilobytes",
           'shared_bytes = attributes["ttg.shared"]', 'shared_bytes = attributes["ttg.shared"] // 1024',
           hint="ttg.shared is in bytes"),
    Mutant("w40.kernel_facts", "warps reported as threads (× 32)", _WARPS, _WARPS + " * 32",
           hint="warps, not threads"),
    Mutant("w40.kernel_facts", "threads per warp read where the warps are", _WARPS,
           'warps = attributes["ttg.threads-per-warp"]', hint="that is ttg.threads-per-warp"),
]

# ---------------------------------------------------------------- day 5: roofline_bound
ROOFLINE_MUTANTS = [
    Mutant("w40.roofline_bound", "milliseconds taken as seconds", "seconds = ms * 1e-3", "seconds = ms",
           hint="ms is milliseconds"),
    Mutant("w40.roofline_bound", "the ridge point inverted (bandwidth over peak)",
           "bound = (intensity >= peak_tflops * 1e3 / peak_gbps)", "bound = (intensity >= peak_gbps / (peak_tflops * 1e3))",
           hint="the ridge point is the peak rate over the bandwidth"),
    Mutant("w40.roofline_bound", "the higher roof taken", "attainable = np.minimum(peak_tflops,",
           "attainable = np.maximum(peak_tflops,", hint="the roof is the LOWER"),
    Mutant("w40.roofline_bound", "the share taken of the compute peak", "share = least / seconds",
           "share = achieved / peak_tflops", hint="not of the compute peak"),
    Mutant("w40.roofline_bound", "GB/s × FLOP/B left in GFLOP/s", "intensity * peak_gbps * 1e-3)  # GB/s",
           "intensity * peak_gbps)  # GB/s", hint="divide by 1e3 for TFLOP/s"),
]

MUTANTS = [*LAYOUT_MUTANTS, *COMPILER_MUTANTS, *LINEAR_MUTANTS, *SPARSE_MUTANTS, *ROOFLINE_MUTANTS, *CAPSTONE_MUTANTS]
