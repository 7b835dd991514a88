"""Wrong solutions of week 39 that the graders must reject, each with words its hint must contain
(see course/mutants.py for the format)."""
from course.mutants import Mutant, Variant  # noqa: F401

# ---------------------------------------------------------------- day 1-2: fusion_bytes, bias_gelu, bias_gelu_backward
_BIAS_LOAD = ("b = tl.load(b_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)\n"
              "    y = gelu(x + b[None, :], TANH)")
_TANH_SECH2 = "sech2 = 4.0 * half_up * tl.sigmoid(-2.0 * u)   # 1 − tanh² u"
ACTIVATION_MUTANTS = [
    # fusion_bytes
    Mutant("w39.fusion_bytes", "the fused kernel still writes every intermediate result",
           "fused = 2 * tensor + extras", "fused = (len(chain) + 1) * tensor + extras",
           hint="the fused kernel writes no intermediate result"),
    Mutant("w39.fusion_bytes", "a vector (bias, norm weight) counted as an (m, n) tensor",
           'counts["vectors"] * n + counts["tensors"] * m * n', 'counts["vectors"] * m * n + counts["tensors"] * m * n',
           hint="a vector (a bias, a norm's weight) is n elements"),
    Mutant("w39.fusion_bytes", "side outputs (the norms' statistics) forgotten",
           ' * itemsize + counts["stats"] * m * STAT_BYTES', " * itemsize", hint="the side outputs are missing"),
    Mutant("w39.fusion_bytes", "extra inputs (bias, weights, residual) forgotten",
           'extras += (counts["vectors"] * n + counts["tensors"] * m * n) * itemsize + ', "extras += ",
           hint="the extra inputs are missing"),
    Mutant("w39.fusion_bytes", "statistics counted at the tensors' itemsize instead of float32",
           'counts["stats"] * m * STAT_BYTES', 'counts["stats"] * m * itemsize', hint="a statistic is float32"),
    Mutant("w39.fusion_bytes", "unfused ops counted as writes only (each intermediate moved once)",
           "unfused = len(chain) * 2 * tensor + extras", "unfused = (len(chain) + 1) * tensor + extras",
           hint="unfused, each op is a kernel of its own"),
    # bias_gelu
    Mutant("w39.bias_gelu", "tanh form with c = 0.0447 instead of 0.044715",
           "inner = 0.7978845608028654 * (z + 0.044715 * z * z * z)", "inner = 0.7978845608028654 * (z + 0.0447 * z * z * z)",
           hint="a constant of the tanh form is off"),
    Mutant("w39.bias_gelu", "tanh form with 2/π where √(2/π) belongs",
           "inner = 0.7978845608028654 * (z + 0.044715", "inner = 0.6366197723675814 * (z + 0.044715",
           hint="a constant of the tanh form is off"),
    Mutant("w39.bias_gelu", "erf(z) where erf(z / √2) belongs",
           "y = 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))", "y = 0.5 * z * (1.0 + tl.erf(z))",
           hint="the erf takes z / √2"),
    Mutant("w39.bias_gelu", "bias not added", "    y = gelu(x + b[None, :], TANH)", "    y = gelu(x, TANH)",
           hint="the bias is not added"),
    Mutant("w39.bias_gelu", "bias indexed by row (one value per row) instead of by column", _BIAS_LOAD,
           "b = tl.load(b_ptr + rows, mask=rows < n_rows, other=0.0).to(tl.float32)\n"
           "    y = gelu(x + b[:, None], TANH)", hint="the bias is indexed by row"),
    Mutant("w39.bias_gelu", "bias indexed by row, its load masked to b's length", _BIAS_LOAD,
           "b = tl.load(b_ptr + rows, mask=rows < n_cols, other=0.0).to(tl.float32)\n"
           "    y = gelu(x + b[:, None], TANH)", hint="the bias is indexed by row"),
    Mutant("w39.bias_gelu", "tanh u as (exp(2u) − 1) / (exp(2u) + 1): inf / inf = NaN for large z",
           "y = z * tl.sigmoid(2.0 * inner)",
           "e = tl.exp(2.0 * inner)\n        y = 0.5 * z * (1.0 + (e - 1.0) / (e + 1.0))", hint="NaN where |z| is large"),
    Mutant("w39.bias_gelu", "the erf form computed when approximate='tanh' was asked",
           "    if TANH:\n        inner = ", "    if False:\n        inner = ", hint="asks for the tanh form"),
    # bias_gelu_backward
    Mutant("w39.bias_gelu_backward", "erf derivative without its z·φ(z) term (the product rule's second half)",
           "grad = cdf + z * pdf", "grad = cdf", hint="the z·φ(z) term is missing"),
    Mutant("w39.bias_gelu_backward", "tanh derivative without the sech² factor",
           "grad = half_up + 0.5 * z * sech2 * 0.79788", "grad = half_up + 0.5 * z * 0.79788",
           hint="the sech² factor is missing"),
    Mutant("w39.bias_gelu_backward", "tanh derivative without the 3·0.044715·z² term of du/dz",
           "0.7978845608028654 * (1.0 + 0.134145 * z * z)", "0.7978845608028654", hint="the 3·0.044715·z² term"),
    Mutant("w39.bias_gelu_backward", "dbias summed along each row of the tile (axis 1) instead of down its columns",
           "tl.sum(column_sums, axis=0)", "tl.sum(column_sums, axis=1)",
           hint="summed over the wrong axis"),
    Mutant("w39.bias_gelu_backward", "the last partial row of dbias left out of stage 2",
           "(part_rows[:, None] < n_parts)", "(part_rows[:, None] < n_parts - 1)",
           hint="the last partial row is left out"),
    Mutant("w39.bias_gelu_backward", "dbias sums dy instead of dx", "column_sums += dx",
           "column_sums += dy", hint="dbias sums dy"),
    Mutant("w39.bias_gelu_backward", "stage 2 overwrites its running total", "db_total += tl.sum(tile, axis=0)",
           "db_total = tl.sum(tile, axis=0)", hint="the running total is overwritten"),
]
# Correct solutions written another way: the graders must accept them.
ACTIVATION_VARIANTS = [
    Variant("w39.bias_gelu", "the tanh form through tanh(u) = 1 − 2 / (1 + exp(2u))",
            "y = z * tl.sigmoid(2.0 * inner)", "y = 0.5 * z * (2.0 - 2.0 / (1.0 + tl.exp(2.0 * inner)))"),
    Variant("w39.bias_gelu_backward", "sech² as 1 − tanh², tanh written as 2·sigmoid(2u) − 1", _TANH_SECH2,
            "sech2 = 1.0 - (2.0 * half_up - 1.0) * (2.0 * half_up - 1.0)  # 1 − tanh² u"),
    Variant("w39.bias_gelu_backward", "dbias summed from dx as stored (rounded to the output dtype)",
            "column_sums += dx", "column_sums += dx.to(dx_ptr.dtype.element_ty).to(tl.float32)"),
]

# ---------------------------------------------------------------- day 3-4: dropout_residual, dropout_residual_layernorm
_DRAW = "keep = u >= p"
_SCALED = "dropped = tl.where(keep, x * (1.0 / (1.0 - p)), 0.0)"
_DRAWS = "philox_draws(seed, offset + start, BLOCK, ALIGNED)"  # the flat kernels' draws
_ROW_DRAWS = "philox_draws(seed, offset + row * n_cols, BLOCK, ALIGNED)"  # the row kernels'
_FORWARD = f"y = r + dropout_block(x, {_DRAWS}, p)"
_BACKWARD = f"dx = dropout_block(dy, {_DRAWS}, p)"
_H = (f"h = r + dropout_block(x, {_ROW_DRAWS}, p)\n"
      "    tl.store(h_ptr + flat, h.to(h_ptr.dtype.element_ty), mask=inside)\n")
_H_LN = _H + "    mean = "  # the LayerNorm kernel's (the RMSNorm kernel stores h the same way)
_STATS = ("mean = tl.sum(h, axis=0) / n_cols\n    centred = tl.where(inside, h - mean, 0.0)\n"
          "    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / n_cols + eps)")
_NORM_Y = "tl.store(y_ptr + flat, (centred * rstd * w + b).to(y_ptr.dtype.element_ty), mask=inside)"
_RSTD = "rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / n_cols + eps)"
DROPOUT_MUTANTS = [
    # dropout_residual
    Mutant("w39.dropout_residual", "kept elements not scaled by 1 / (1 - p)", _SCALED,
           "dropped = tl.where(keep, x, 0.0)", hint="the kept elements are not scaled"),
    Mutant("w39.dropout_residual", "scaled by 1 / p instead of 1 / (1 - p)", _SCALED,
           "dropped = tl.where(keep, x * (1.0 / p), 0.0)", hint="scaled by 1 / p"),
    Mutant("w39.dropout_residual", "the mask inverted: kept where u < p", _DRAW, "keep = u < p",
           hint="the mask is inverted"),
    Mutant("w39.dropout_residual", "the backward regenerates its mask at offset + 1", _BACKWARD,
           _BACKWARD.replace("offset + start", "offset + start + 1"),
           hint="the backward draws its mask at other counters"),
    Mutant("w39.dropout_residual", "the backward regenerates its mask from draw 0, ignoring the forward's offset",
           _BACKWARD, _BACKWARD.replace("offset + start", "start"),
           hint="the backward draws its mask at other counters"),
    Mutant("w39.dropout_residual", "the residual not added", _FORWARD, _FORWARD.replace("y = r + ", "y = "),
           hint="the residual is not added"),
    Mutant("w39.dropout_residual", "seed and offset swapped in the forward's draw", _FORWARD,
           _FORWARD.replace("seed, offset + start", "offset, seed + start"), hint="seed and offset are swapped"),
    Mutant("w39.dropout_residual", "the backward passes dy through (no mask, no scale)", _BACKWARD, "dx = dy",
           hint="the backward ignores the mask"),
    # dropout_residual_layernorm
    Mutant("w39.dropout_residual_layernorm", "residual added after the norm: y = LN(dropout(x))·w + b + residual",
           _H + "    " + _STATS + "\n    " + _NORM_Y,
           f"dropped = dropout_block(x, {_ROW_DRAWS}, p)\n    h = r + dropped\n"
           "    tl.store(h_ptr + flat, h.to(h_ptr.dtype.element_ty), mask=inside)\n    "
           + _STATS.replace("(h, axis=0)", "(dropped, axis=0)").replace("h - mean", "dropped - mean") + "\n    "
           + _NORM_Y.replace("* w + b)", "* w + b + r)"), hint="the residual is added after the norm"),
    Mutant("w39.dropout_residual_layernorm", "statistics (mean, variance) taken on x instead of h", _STATS,
           _STATS.replace("(h, axis=0)", "(x, axis=0)").replace("h - mean", "x - mean"),
           hint="the statistics are x's"),
    Mutant("w39.dropout_residual_layernorm", "h (the residual stream) not written", _H_LN,
           f"h = r + dropout_block(x, {_ROW_DRAWS}, p)\n    mean = ", hint="never written"),
    Mutant("w39.dropout_residual_layernorm", "the kept elements not scaled by 1 / (1 - p) (in dropout_block)",
           _SCALED, "dropped = tl.where(keep, x, 0.0)", hint="the kept elements are not scaled"),
    Mutant("w39.dropout_residual_layernorm", "eps outside the square root", _RSTD,
           _RSTD.replace("/ n_cols + eps)", "/ n_cols) + eps"), hint="eps belongs inside the square root"),
    Mutant("w39.dropout_residual_layernorm", "every row draws the same mask (from offset, not offset + row·n_cols)",
           _H_LN, _H_LN.replace("offset + row * n_cols", "offset"), hint="every row drew the same mask"),
    Mutant("w39.dropout_residual_layernorm", "the mask inverted: kept where u < p (in dropout_block)", _DRAW,
           "keep = u < p", hint="the mask is inverted"),
    Mutant("w39.dropout_residual_layernorm", "h rounded to the storage dtype before the norm reads it", _H_LN,
           _H + "    h = h.to(h_ptr.dtype.element_ty).to(tl.float32)\n    mean = ", hint="after rounding it"),
]
# Correct solutions written another way: the graders must accept them.
DROPOUT_VARIANTS = [
    Variant("w39.dropout_residual", "the mask as drop = u < p, the scale applied after the select",
            _DRAW + "\n    " + _SCALED,
            "drop = u < p\n    dropped = tl.where(drop, 0.0, x) * (1.0 / (1.0 - p))"),
    Variant("w39.dropout_residual", "x divided by 1 - p instead of multiplied by its inverse", _SCALED,
            "dropped = tl.where(keep, x / (1.0 - p), 0.0)"),
    Variant("w39.dropout_residual_layernorm", "rstd through tl.rsqrt", _RSTD,
            "rstd = tl.rsqrt(tl.sum(centred * centred, axis=0) / n_cols + eps)"),
    Variant("w39.dropout_residual_layernorm", "the corrected two-pass variance (Chan, Golub, LeVeque, \"Algorithms for "
            "computing the sample variance\"): mean(c²) − mean(c)², c = h − mean",
            _RSTD, "rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / n_cols - tl.sum(centred, axis=0) "
            "* tl.sum(centred, axis=0) / (n_cols * n_cols) + eps)"),
]

# ---------------------------------------------------------------- day 5: rope_attention
_PROLOGUE = ("q1 = (q1 * qk_scale).to(q_ptr.dtype.element_ty)  # the fused scaling, once per query instead of once per "
             "score\n    q2 = (q2 * qk_scale).to(q_ptr.dtype.element_ty)")
_KEYS = "k1, k2 = rotate_half_tile(k_head + cols[:, None] * skn, cols, c,"
ATTENTION_MUTANTS = [
    Mutant("w39.rope_attention", "pairs interleaved: (x[2c], x[2c + 1]) turned, not the halves (x[c], x[c + d/2])",
           "x1 = tl.load(row_ptrs + c[None, :], mask=mask, other=0.0).to(tl.float32)\n"
           "    x2 = tl.load(row_ptrs + HALF + c[None, :], mask=mask, other=0.0)",
           "x1 = tl.load(row_ptrs + 2 * c[None, :], mask=mask, other=0.0).to(tl.float32)\n"
           "    x2 = tl.load(row_ptrs + 2 * c[None, :] + 1, mask=mask, other=0.0)",
           hint="not neighbours (x[2c], x[2c + 1])"),
    Mutant("w39.rope_attention", "the rotation turns the wrong way (the sign of sin flipped)",
           "y1 = x1 * cos - x2 * sin\n    y2 = x2 * cos + x1 * sin",
           "y1 = x1 * cos + x2 * sin\n    y2 = x2 * cos - x1 * sin", hint="the rotation turns the wrong way"),
    Mutant("w39.rope_attention", "cos and sin swapped",
           "cos = tl.load(cos_ptr + angle, mask=mask, other=0.0).to(tl.float32)\n    sin = tl.load(sin_ptr + angle,",
           "cos = tl.load(sin_ptr + angle, mask=mask, other=0.0).to(tl.float32)\n    sin = tl.load(cos_ptr + angle,",
           hint="cos and sin are swapped"),
    Mutant("w39.rope_attention", "every key rotated at position 0 (so not at all)", _KEYS,
           _KEYS.replace("cols, c,", "cols * 0, c,"), hint="the keys are not rotated"),
    Mutant("w39.rope_attention", "the keys rotated by their index inside the key block", _KEYS,
           _KEYS.replace("cols, c,", "cols - begin, c,"), hint="index inside the block"),
    Mutant("w39.rope_attention", "the queries rotated by their index inside the query block",
           "q1, q2 = rotate_half_tile(q_rows, rows, c,", "q1, q2 = rotate_half_tile(q_rows, rows - pid_m * BLOCK_M, c,",
           hint="index inside the block"),
    Mutant("w39.rope_attention", "v rotated too",
           "v1 = tl.load(v_rows + c[None, :], mask=inside, other=0.0)\n"
           "        v2 = tl.load(v_rows + HALF + c[None, :], mask=inside, other=0.0)",
           "v1, v2 = rotate_half_tile(v_rows, cols, c, inside, cos_ptr, sin_ptr, HALF)\n"
           "        v1, v2 = v1.to(q1.dtype), v2.to(q2.dtype)", hint="v is rotated too"),
    Mutant("w39.rope_attention", "the scale never folded into the query tile", _PROLOGUE,
           "q1 = q1.to(q_ptr.dtype.element_ty)\n    q2 = q2.to(q_ptr.dtype.element_ty)",
           hint="the scores are not scaled"),
]
ATTENTION_VARIANTS = [
    Variant("w39.rope_attention", "the rotated, scaled query and key tiles kept in float32 for the dots", _PROLOGUE,
            "q1 = q1 * qk_scale\n    q2 = q2 * qk_scale"),
    Variant("w39.rope_attention", "other tiles in the interpreter (BLOCK_M 16, BLOCK_N 32)", "return 32, 16, 4, 1",
            "return 16, 32, 4, 1"),
]

MUTANTS = [*ACTIVATION_MUTANTS, *DROPOUT_MUTANTS, *ATTENTION_MUTANTS]
VARIANTS = [*ACTIVATION_VARIANTS, *DROPOUT_VARIANTS, *ATTENTION_VARIANTS]
