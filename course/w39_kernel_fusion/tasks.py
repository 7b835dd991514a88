"""Graded tasks of week 39: the cases each exercise is swept over, and a diagnosis of a failure (the output is compared
with what each known bug would have produced on the same inputs: grading.diagnose)."""
import numpy as np

from ..grading import Case, Task, diagnose, pick, seen  # noqa: F401
from . import reference as ref

# ---------------------------------------------------------------- day 1-2: byte counts, bias + activation
from ..grading import exact  # noqa: E402

ACTIVATION_DTYPES = ("float32", "float16", "bfloat16")  # float32 first: its tight tolerance shows the subtle bugs
ACTIVATION_BANNED = tuple(f"{m}.{f}" for m, names in (("torch.nn.functional", ("gelu", "silu", "tanh")),
                                                       ("torch", ("erf", "tanh")), ("torch.special", ("erf",)),
                                                       ("torch.Tensor", ("erf", "tanh"))) for f in names)
EXACT = 1e-9  # byte counts are integers: a known mistake matches only when it gives the same integer


# ---- fusion_bytes
FUSED_INTERMEDIATES = ("the fused kernel writes no intermediate result and reads none back: it reads the chain's "
                       "input once and writes its final output once (2·m·n·itemsize); only the unfused chain sends "
                       "every op's output through memory")
UNFUSED_PER_OP = ("unfused, each op is a kernel of its own: it reads its input and writes its output, "
                  "2·m·n·itemsize per op")
VECTOR_AS_TENSOR = "a vector (a bias, a norm's weight) is n elements, read once: only the residual is an (m, n) tensor"
SIDE_OUTPUTS = ("the side outputs are missing: LayerNorm writes a mean and an rstd per row, RMSNorm an rstd, fused "
                "or not")
EXTRA_INPUTS = ("the extra inputs are missing: each op reads its own (a bias or a norm's weight of n elements, a "
                "residual of m·n), fused or not")
STATS_ITEMSIZE = "a statistic is float32 whatever the tensors' dtype: STAT_BYTES = 4 bytes per row each, not itemsize"
IN_ELEMENTS = "count bytes, not elements: every tensor's elements times its itemsize (STAT_BYTES for statistics)"


def _bytes(chain, m, n, itemsize, vector=None, tensors=True, stats=ref.STAT_BYTES, kept=0, per_op=2):
    """(unfused, fused) with one slip: `vector` elements per vector, residuals dropped (tensors=False), `stats`
    bytes per statistic, `kept` intermediates moved by the fused kernel per op boundary, `per_op` tensors per
    unfused op."""
    vector = n if vector is None else vector
    extras = sum((ref.OPS[op]["vectors"] * vector + ref.OPS[op]["tensors"] * m * n * tensors) * itemsize
                 + ref.OPS[op]["stats"] * m * stats for op in chain)
    tensor = m * n * itemsize
    return per_op * len(chain) * tensor + extras, (2 + kept * (len(chain) - 1)) * tensor + extras


def bytes_variants(chain, m, n, itemsize):
    """hint -> [(unfused, fused)] of the byte count's known slips."""
    count = lambda **slip: _bytes(chain, m, n, itemsize, **slip)  # noqa: E731
    return {
        FUSED_INTERMEDIATES: [count(kept=1), count(kept=2)],
        UNFUSED_PER_OP: [count(per_op=1), (count()[0] - (len(chain) - 1) * m * n * itemsize, count()[1])],
        VECTOR_AS_TENSOR: [count(vector=m * n)],
        SIDE_OUTPUTS: [count(stats=0)],
        EXTRA_INPUTS: [count(vector=0, tensors=False, stats=ref.STAT_BYTES), count(vector=0), count(tensors=False),
                       count(vector=0, tensors=False, stats=0)],
        STATS_ITEMSIZE: [count(stats=itemsize)],
        IN_ELEMENTS: [_bytes(chain, m, n, 1, stats=1)],
    }


def bytes_hint(case, got, expected):
    variants = bytes_variants(**case.kwargs)
    return diagnose(got, expected, pick(variants, ("unfused", "fused").index(case.output)), rtol=EXACT)


CHAINS = (("bias", "gelu"), ("bias", "silu"), ("dropout", "residual", "layernorm"), ("residual", "rmsnorm"),
          ("bias", "gelu", "dropout", "residual", "layernorm"))


def bytes_cases(rng, dtypes):
    """The lessons' chains at model sizes, one-op chains, m or n = 1, and random chains of random sizes."""
    fixed = [(("bias", "gelu"), 4096, 4096, 2), (("dropout", "residual", "layernorm"), 8192, 1024, 2),
             (("residual", "rmsnorm"), 1, 4097, 2), (("bias", "silu"), 37, 1, 4), (("gelu",), 1, 1, 4),
             (("layernorm",), 3, 5, 2)]
    drawn = []
    for i in range(8):
        chain = CHAINS[i % len(CHAINS)] if i < len(CHAINS) else tuple(rng.choice(list(ref.OPS), rng.integers(1, 6)))
        m, n = (int(rng.choice([1, rng.integers(2, 5000)])) for _ in range(2))
        drawn.append((tuple(str(op) for op in chain), m, n, int(rng.choice([2, 4]))))
    return [Case(f"{' → '.join(chain)} on ({m}, {n}), {itemsize}-byte elements", (), "float64",
                 kwargs={"chain": chain, "m": m, "n": n, "itemsize": itemsize}) for chain, m, n, itemsize in fixed + drawn]


# ---- bias_gelu
TANH_CONSTANTS = ("a constant of the tanh form is off: y = 0.5·z·(1 + tanh(√(2/π)·(z + 0.044715·z³))), "
                  "√(2/π) ≈ 0.7978845608")
ERF_SCALE = "the erf takes z / √2: Φ(z) = (1 + erf(z / √2)) / 2, the normal distribution's CDF"
ERF_FOR_TANH = "approximate=\"tanh\" asks for the tanh form: 0.5·z·(1 + tanh(√(2/π)·(z + 0.044715·z³)))"
TANH_FOR_ERF = "approximate=\"none\" asks for the exact erf form: 0.5·z·(1 + erf(z / √2))"
NO_BIAS = "the bias is not added: y = GELU(x + b)"
BIAS_BY_ROW = ("the bias is indexed by row: b has one value per column, b[c] is added to column c of every row "
               "(load it at the column offsets)")
HALF_MISSING = "the factor 0.5 is missing: GELU(z) = z·Φ(z) = 0.5·z·(1 + erf(z / √2))"
NO_Z = "GELU(z) = z·Φ(z): Φ(z) alone is missing the factor z"
OVERFLOW = ("NaN where |z| is large: exp overflowed to inf, and inf / inf is NaN. Write the tanh form so that it "
            "saturates: 0.5·(1 + tanh u) = sigmoid(2u), or tanh u = 1 − 2 / (1 + exp(2u))")
EXP_LIMIT = 88.72  # exp(x) overflows float32 above log(2^128)


def _bias_by_row(x, bias):
    """x + b[r] on row r of the (rows, n) view where r < n (0 where a masked load past b's end gives 0)."""
    n = x.shape[-1]
    rows = np.arange(x.size // n)[:, None]
    return (x.reshape(-1, n) + np.where(rows < n, bias[np.minimum(rows, n - 1)], 0.0)).reshape(x.shape)


def _cdf(z, approximate):
    """Φ(z), or its tanh form 0.5·(1 + tanh(√(2/π)·(z + 0.044715·z³))): GELU(z) / z."""
    if approximate == "tanh":
        return 0.5 * (1 + np.tanh(ref.SQRT_2_OVER_PI * (z + ref.TANH_CUBIC * z ** 3)))
    return 0.5 * (1 + ref._erf(z / np.sqrt(2)))


def gelu_variants(x, bias, approximate="none"):
    """hint -> y of bias + GELU's known slips, in float64."""
    z = x + bias
    with np.errstate(all="ignore"):
        out = {NO_BIAS: ref.gelu(x, approximate), BIAS_BY_ROW: ref.gelu(_bias_by_row(x, bias), approximate),
               HALF_MISSING: 2 * ref.gelu(z, approximate), NO_Z: _cdf(z, approximate)}
        if approximate == "tanh":
            root = ref.SQRT_2_OVER_PI
            out[ERF_FOR_TANH] = ref.gelu(z)
            u, right = root * (z + ref.TANH_CUBIC * z ** 3), ref.gelu(z, "tanh")
            out[OVERFLOW] = [np.where(big, np.nan, right) for big in (2 * u > EXP_LIMIT, np.abs(u) > EXP_LIMIT,
                                                                      np.abs(2 * u) > EXP_LIMIT)]
            out[TANH_CONSTANTS] = [ref.gelu(z, "tanh", k, c) for k, c in
                                   ((root, 0.0447), (root, 0.04471), (root, 0.0448), (root, 0.44715), (root, 0.0),
                                    (2 / np.pi, 0.044715), (np.sqrt(np.pi / 2), 0.044715),
                                    (np.sqrt(2) / np.pi, 0.044715), (2 / np.sqrt(np.pi), 0.044715))]
        else:
            out[ERF_SCALE] = [0.5 * z * (1 + ref._erf(z)), 0.5 * z * (1 + ref._erf(z * np.sqrt(2))),
                              0.5 * z * (1 + ref._erf(z / 2))]
            out[TANH_FOR_ERF] = ref.gelu(z, "tanh")
    return out


def gelu_hint(case, got, expected):
    return diagnose(got, expected, gelu_variants(*seen(case), **case.kwargs))


def _gelu_inputs(rng):
    """(name, x, bias) for every shape and adversarial input of bias + GELU; the shapes where a bias indexed by
    row still stays inside b (rows <= n) come first."""
    normal = lambda *shape: rng.normal(0, 2, shape)  # noqa: E731
    return [
        ("(1, 1)", normal(1, 1), normal(1)),
        ("one row of 7", normal(1, 7), normal(7)),
        ("(48, 48): as many rows as columns", normal(48, 48), normal(48)),
        ("(2, 3, 129): leading dims are rows", normal(2, 3, 129), normal(129)),
        ("z in [-3, -1.5], the left tail where the tanh form's constants show", rng.uniform(-3, -1.5, (4, 40)),
         np.zeros(40)),
        ("(37, 33): no block divides either", normal(37, 33), normal(33)),
        ("(300, 5): many short rows", normal(300, 5), normal(5)),
        ("(3, 1500): several column blocks", normal(3, 1500), normal(1500)),
        ("large |z| (±20): erf and tanh saturate", rng.choice([-1, 1], (6, 50)) * rng.uniform(15, 20, (6, 50)),
         rng.uniform(-2, 2, 50)),
        ("z near 0 (|z| < 1e-3)", rng.uniform(-5e-4, 5e-4, (5, 20)), rng.uniform(-5e-4, 5e-4, 20)),
    ]


def bias_gelu_cases(rng, dtypes):
    return [Case(f"{name}, approximate={approximate!r}", (x, bias), dtype, kwargs={"approximate": approximate})
            for dtype in dtypes for approximate in ("none", "tanh") for name, x, bias in _gelu_inputs(rng)]


# ---- bias_gelu_backward
NO_PDF = ("the z·φ(z) term is missing: GELU'(z) = Φ(z) + z·φ(z), φ(z) = exp(−z²/2) / √(2π) (the product rule on "
          "z·Φ(z))")
NO_SECH2 = ("the sech² factor is missing: d tanh(u)/dz = (1 − tanh² u)·du/dz, so GELU'(z) = 0.5·(1 + tanh u) + "
            "0.5·z·(1 − tanh² u)·√(2/π)·(1 + 3·0.044715·z²)")
NO_CUBIC = ("the 3·0.044715·z² term is missing: du/dz = √(2/π)·(1 + 3·0.044715·z²) for u = √(2/π)·(z + 0.044715·z³)")
WRONG_FORM = "the derivative of the other GELU form: approximate picks erf or tanh in the backward as in the forward"
GRAD_NO_BIAS = "the derivative is taken at x: it is GELU'(x + b), the bias added as in the forward"
DBIAS_FROM_DY = "dbias sums dy: it sums dx = dy·GELU'(x + b) over the rows (the bias sits inside the GELU)"
WRONG_AXIS = ("dbias was summed over the wrong axis of the tile (axis 1, along a row): sum over its rows, axis 0, "
              "one sum per column (with square tiles both compile)")
LAST_PART = ("the last partial row is left out: the partial rows run from 0 to n_parts − 1 inclusive "
             "(mask part_rows < n_parts)")
FIRST_PARTS = "only the first BLOCK_P partial rows are summed: loop over all n_parts, BLOCK_P at a time"
OVERWRITTEN = "the running total is overwritten at each step: add each tile's sum into it (db_total += …)"
DBIAS_BLOCK = 64  # solutions/w39_kernel_fusion.py's bias_gelu_backward_kernel tiles: the two must agree


def _cdiv(a, b):
    return -(-a // b)


def _dbias_layouts(n_rows, n_cols):
    """Rows per program that bias_gelu_backward may choose: about 6 programs on CPU, 8 per SM on a GPU, over all
    column blocks, whole tiles of DBIAS_BLOCK rows each (solutions' _dbias_layout)."""
    import torch
    programs = {6} | ({8 * torch.cuda.get_device_properties(0).multi_processor_count} if torch.cuda.is_available()
                      else set())
    tiles = _cdiv(n_rows, DBIAS_BLOCK)
    for count in sorted(programs):
        wanted = max(1, _cdiv(count, _cdiv(n_cols, DBIAS_BLOCK)))
        yield DBIAS_BLOCK * _cdiv(tiles, min(wanted, tiles))


def _across_rows(dx, rows_per_program):
    """dbias when each BLOCK × BLOCK tile is summed along its rows (axis 1): tile row i's sum lands in column i of
    the tile's column block."""
    n, b = dx.shape[1], DBIAS_BLOCK
    out = np.zeros(n)
    for first in range(0, len(dx), rows_per_program):
        last = min(first + rows_per_program, len(dx))
        for col in range(0, n, b):
            sums = np.zeros(b)
            for start in range(first, last, b):
                tile = dx[start:min(start + b, last), col:col + b].sum(axis=1)
                sums[:len(tile)] += tile
            out[col:col + b] += sums[:min(b, n - col)]
    return out


def backward_variants(x, bias, dy, approximate="none"):
    """hint -> [(dx, dbias)] of the backward's known slips: the derivative's, and dbias's two-stage sum's."""
    n = x.shape[-1]
    z = x + bias
    with_dx = lambda dx: (dx, dx.reshape(-1, n).sum(axis=0))  # noqa: E731
    dx = dy * ref.gelu_grad(z, approximate)
    rows = dx.reshape(-1, n)
    out = {GRAD_NO_BIAS: [with_dx(dy * ref.gelu_grad(x, approximate))], DBIAS_FROM_DY: [(dx, dy.reshape(-1, n).sum(0))],
           WRONG_FORM: [with_dx(dy * ref.gelu_grad(z, "none" if approximate == "tanh" else "tanh"))]}
    if approximate == "tanh":
        k, c = ref.SQRT_2_OVER_PI, ref.TANH_CUBIC
        t = np.tanh(k * (z + c * z ** 3))
        out[NO_SECH2] = [with_dx(dy * (0.5 * (1 + t) + 0.5 * z * k * (1 + 3 * c * z * z)))]
        out[NO_CUBIC] = [with_dx(dy * (0.5 * (1 + t) + 0.5 * z * (1 - t * t) * k))]
    else:
        out[NO_PDF] = [with_dx(dy * _cdf(z, approximate))]
    for rows_per_program in _dbias_layouts(*rows.shape):
        parts = np.stack([rows[p:p + rows_per_program].sum(axis=0) for p in range(0, len(rows), rows_per_program)])
        out.setdefault(WRONG_AXIS, []).append((dx, _across_rows(rows, rows_per_program)))
        if len(parts) > 1:
            out.setdefault(LAST_PART, []).append((dx, parts[:-1].sum(axis=0)))
        for block_p in (4, 32):
            if len(parts) > block_p:
                out.setdefault(FIRST_PARTS, []).append((dx, parts[:block_p].sum(axis=0)))
                out.setdefault(OVERWRITTEN, []).append((dx, parts[(len(parts) - 1) // block_p * block_p:].sum(0)))
    return out


def backward_hint(case, got, expected):
    variants = backward_variants(*seen(case), **case.kwargs)
    return diagnose(got, expected, pick(variants, ("dx", "dbias").index(case.output)))


def _backward_inputs(rng):
    """(name, x, bias, dy): bias + GELU's inputs and shapes with several partial rows of dbias (more rows than a
    tile), several tiles per program, several column blocks."""
    normal = lambda *shape: rng.normal(0, 2, shape)  # noqa: E731
    picked = [_gelu_inputs(rng)[i] for i in (0, 1, 3, 4, 5, 6, 8, 9)]
    more = [("(130, 70): two column blocks, three row tiles", normal(130, 70), normal(70)),
            ("(1000, 9): several tiles per program", normal(1000, 9), normal(9)),
            ("(2100, 3): more partial rows than stage 2 sums at once", normal(2100, 3), normal(3))]
    return [(name, x, bias, rng.normal(0, 1, x.shape)) for name, x, bias in picked + more]


def bias_gelu_backward_cases(rng, dtypes):
    return [Case(f"{name}, approximate={approximate!r}", (x, bias, dy), dtype, kwargs={"approximate": approximate})
            for dtype in dtypes for approximate in ("none", "tanh") for name, x, bias, dy in _backward_inputs(rng)]


ACTIVATION_TASKS = [
    Task("w39.fusion_bytes", "numpy", ("fusion_bytes",), bytes_cases, exact(ref.fusion_bytes),
         outputs=("unfused", "fused"), hint=bytes_hint, dtypes=("float64",)),
    Task("w39.bias_gelu", "triton", ("gelu", "bias_gelu_kernel"), bias_gelu_cases, ref.bias_gelu, writes_out=True,
         banned=ACTIVATION_BANNED, hint=gelu_hint, dtypes=ACTIVATION_DTYPES),
    Task("w39.bias_gelu_backward", "triton", ("gelu_grad", "bias_gelu_backward_kernel", "bias_grad_kernel"),
         bias_gelu_backward_cases, ref.bias_gelu_backward, outputs=("dx", "dbias"), banned=ACTIVATION_BANNED,
         hint=backward_hint, dtypes=ACTIVATION_DTYPES, scale=ref.bias_gelu_backward_scale),
]

# ---------------------------------------------------------------- day 3-4: dropout + residual (+ LayerNorm)
# The masks are Philox draws the reference reproduces bit for bit (reference.philox_uniform), so the grader knows
# which elements a kernel must keep. A failure is diagnosed by redrawing the mask the way each known slip draws it
# (another counter, seed and offset swapped, the comparison turned round) on the case's own inputs.
from ..grading import to_backend, to_float64  # noqa: E402
from ..w34_layernorm import reference as norm_ref  # noqa: E402
from ..w34_layernorm.tasks import EPS_INSIDE, OFFSET, OFFSET_SPREAD, OFFSET_TOLERANCE, layernorm_variants  # noqa: E402

DROPOUT_DTYPES = ("float32", "float16", "bfloat16")
DROPOUT_BANNED = ("torch.nn.functional.dropout", "torch.dropout", "torch.nn.functional.layer_norm",
                  "torch.layer_norm", "torch.rand", "torch.rand_like", "torch.bernoulli")
ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
EXACT_AT_ZERO = ("p = 0 keeps every element with scale 1: y = x + residual and dx = dy, rounded once to the dtype "
                 "(unit roundoff {:.3g}) and nothing else")

SCALE_MISSING = ("the kept elements are not scaled: inverted dropout multiplies them by 1 / (1 − p), so the "
                 "expected value of the output is x's")
SCALE_BY_P = "the kept elements are scaled by 1 / p: the kept fraction is 1 − p, so the scale is 1 / (1 − p)"
INVERTED = ("the mask is inverted: an element is kept where its draw u >= p (a fraction 1 − p of them), dropped "
            "where u < p")
NO_RESIDUAL = "the residual is not added: y = residual + dropout(x)"
OTHER_COUNTER = ("the backward draws its mask at other counters than the forward: element i must take draw "
                 "offset + i of the stream in both passes, with the forward's offset")
SWAPPED = "seed and offset are swapped: element i takes draw offset + i of the stream of that seed"
NO_MASK = ("the backward ignores the mask: dx = keep·dy / (1 − p) with the forward's mask, zero where the forward "
           "dropped the element")
SAME_ROW_MASK = ("every row drew the same mask: element (row, col) takes draw offset + row·n_cols + col, its index "
                 "in the flat tensor")
AFTER_NORM = ("the residual is added after the norm: h = residual + dropout(x) first, then y = LayerNorm(h)·w + b "
              "(and mean, rstd are h's)")
STATS_OF_X = ("the statistics are x's: mean and rstd are those of h = residual + dropout(x), the tensor being "
              "normalised")
ROUNDED_H = ("the norm read h after rounding it to the storage dtype: normalise the float32 h in registers, round "
             "only what you store")


def _kept(shape, p, seed, offset):
    return ref.dropout_keep(shape, p, seed, offset)


def _moved_offsets(offset, n):
    """Counters a backward might draw at by mistake: next to the forward's, from 0, or one tensor further on."""
    return sorted({offset + 1, max(offset - 1, 0), offset + 4, max(offset - 4, 0), 0, offset + n} - {offset})


def dropout_variants(x, r, dy, p, seed, offset):
    """hint -> [(y, dx)] that each known slip of dropout + residual makes of the case's own inputs (None: that output
    is right under this slip)."""
    keep = _kept(x.shape, p, seed, offset)
    swapped = _kept(x.shape, p, offset, seed)
    over_p = 1 / p if p else np.inf
    with np.errstate(all="ignore"):
        def y(k=keep, scale=1 / (1 - p), residual=r):
            return residual + np.where(k, x * scale, 0.0)

        def dx(k=keep, scale=1 / (1 - p)):
            return np.where(k, dy * scale, 0.0)
        return {
            SCALE_MISSING: [(y(scale=1.0), dx(scale=1.0))],
            SCALE_BY_P: [(y(scale=over_p), dx(scale=over_p))],
            INVERTED: [(y(~keep), dx(~keep)), (y(~keep, over_p), dx(~keep, over_p))],
            NO_RESIDUAL: [(y(residual=0.0), None)],
            OTHER_COUNTER: [(None, dx(_kept(x.shape, p, seed, o))) for o in _moved_offsets(offset, x.size)],
            SWAPPED: [(y(swapped), dx(swapped))],
            NO_MASK: [(None, dy / (1 - p)), (None, dy)],
        }


def dropout_hint(case, got, expected):
    return diagnose(got, expected, pick(dropout_variants(*seen(case), **case.kwargs), ("y", "dx").index(case.output)))


def _draw(rng, large):
    """A fresh seed: below 2^16, or at least 2^32 (so the key's high word is used)."""
    return int(rng.integers(2 ** 32, 2 ** 62)) if large else int(rng.integers(0, 2 ** 16))


def dropout_cases(rng, dtypes):
    normal = lambda *shape: rng.normal(0, 1, shape)  # noqa: E731
    shapes = [  # (name, shape, p, large seed, offset): several blocks of 1024 (GPU) or 4096 (CPU) where it matters
        ("one element (1, 1)", (1, 1), 0.5, False, 0),
        ("(37, 33): odd sizes, seed >= 2^32, an odd offset", (37, 33), 0.9, True, 2 * int(rng.integers(0, 10 ** 6)) + 1),
        ("(2, 3, 129): leading dims, p drawn at random", (2, 3, 129), float(rng.uniform(0.05, 0.95)), True,
         int(rng.integers(1, 2 ** 40))),
        ("(6, 1000): several blocks from an offset that is a multiple of 4, counters cross 2^31", (6, 1000), 0.1, True,
         2 ** 33 - 4 * int(rng.integers(1, 1250))),
        ("(3, 700): counters cross 2^32 (the counter's high word turns 1), an offset 4k + 2", (3, 700), 0.5, False,
         2 ** 34 - 4 * int(rng.integers(1, 500)) + 2),
        ("(5, 77): y = x + residual exactly", (5, 77), 0.0, False, int(rng.integers(0, 1000))),
    ]
    cases = []
    for dtype in dtypes:
        for name, shape, p, large, offset in shapes:
            tolerance = (0.0, ROUNDOFF[dtype] * (1 + 2 ** -20), EXACT_AT_ZERO.format(ROUNDOFF[dtype])) if p == 0 \
                else None
            cases.append(Case(f"{name}, p = {p:.3g}", (normal(*shape), normal(*shape), normal(*shape)), dtype,
                              tolerance, kwargs={"p": p, "seed": _draw(rng, large), "offset": offset}))
    return cases


def _round(array, dtype):
    return to_float64(to_backend("torch", array, dtype, device="cpu"))


def dropout_layernorm_variants(x, r, w, b, p, seed, offset, dtype="float32"):
    """hint -> [(y, h, mean, rstd)] that each known slip of the fused dropout + residual + LayerNorm makes of the
    case's own inputs (None: that output is right under this slip)."""
    keep = _kept(x.shape, p, seed, offset)
    row_mask = np.broadcast_to(_kept(x.shape[-1:], p, seed, offset), x.shape)

    def dropped(k=keep, scale=1 / (1 - p)):
        return np.where(k, x * scale, 0.0)

    def normed(h, stats_of=None):  # (y, h, mean, rstd) of LayerNorm(h), with the statistics of `stats_of`
        mean, rstd = norm_ref.layernorm(h if stats_of is None else stats_of, w, b)[1:]
        return (h - mean[..., None]) * rstd[..., None] * w + b, h, mean, rstd
    h = r + dropped()
    mean, var = norm_ref.mean_var(h)
    with np.errstate(all="ignore"):
        def eps_slip(rstd):
            return (h - mean[..., None]) * rstd[..., None] * w + b, None, None, rstd
        after = normed(dropped())              # the norm of dropout(x) alone, the residual added to y
        x_stats, x_normed = normed(h, x), normed(x)
        rounded = normed(_round(h, dtype))     # h as stored, normalised
        root = np.sqrt(var)
        out = {
            AFTER_NORM: [(after[0] + r, None, after[2], after[3]), (after[0] + r, None, None, None)],
            STATS_OF_X: [(x_stats[0], None, *x_stats[2:]), (x_normed[0], None, *x_normed[2:])],
            SCALE_MISSING: [normed(r + dropped(scale=1.0))],
            INVERTED: [normed(r + dropped(~keep))],
            SAME_ROW_MASK: [normed(r + dropped(row_mask))],
            SWAPPED: [normed(r + dropped(_kept(x.shape, p, offset, seed)))],
            EPS_INSIDE.format("var"): [eps_slip(v) for v in (1 / root + norm_ref.EPS, 1 / (root + norm_ref.EPS),
                                                              1 / root)],
            ROUNDED_H: [(rounded[0], None, *rounded[2:])],
        }
        # week 34's slips of the norm itself, on y (its CUDA kernel's Chan-merge slip does not apply here)
        for hint, forms in layernorm_variants(h, w, b).items():
            if "Chan" not in hint:
                out.setdefault(hint, []).extend((form, None, None, None) for form in
                                                (forms if isinstance(forms, list) else [forms]))
        return out


def dropout_layernorm_hint(case, got, expected):
    x, r, w, b = seen(case)
    variants = dropout_layernorm_variants(x, r, w, b, dtype=case.dtype, **case.kwargs)
    return diagnose(got, expected, pick(variants, ("y", "h", "mean", "rstd").index(case.output)))


def dropout_layernorm_cases(rng, dtypes):
    normal = lambda *shape: rng.normal(0, 2, shape)  # noqa: E731
    cases = []
    for dtype in dtypes:
        spread = OFFSET_SPREAD[dtype]
        rows = [  # (name, x, residual, p, large seed, tolerance): week 34's rows (fewer of them), each with its p
            ("N = 1, shape (1, 1)", normal(1, 1), normal(1, 1), 0.5, False, None),
            ("random (5, 33): not a multiple of any block", normal(5, 33), normal(5, 33), 0.9, False, None),
            ("random (2, 3, 129): leading dims are rows", normal(2, 3, 129), normal(2, 3, 129), 0.1, True, None),
            ("long rows (2, 5000)", normal(2, 5000), normal(2, 5000), 0.5, True, None),
            (f"large offset: residual {OFFSET:g} + N(0, {spread:g}^2), where E[h²] − E[h]² cancels",
             rng.normal(0, spread, (3, 300)), OFFSET + rng.normal(0, spread, (3, 300)), 0.5, False,
             OFFSET_TOLERANCE.get(dtype)),
            ("constant rows: x = 0, residual 3 (variance 0)", np.zeros((2, 50)), np.full((2, 50), 3.0), 0.5, False,
             None),
            ("tiny rows (scale 1e-3): eps is not negligible", rng.normal(0, 1e-3, (3, 64)),
             rng.normal(0, 1e-3, (3, 64)), 0.9, True, None),
            ("(3, 96): LayerNorm(x + residual)", normal(3, 96), normal(3, 96), 0.0, False, None),
        ]
        for index, (name, x, r, p, large, tolerance) in enumerate(rows):
            n = x.shape[-1]
            inputs = (x, r, rng.normal(1, 0.5, n), rng.normal(0, 0.5, n))
            # offsets alternate between multiples of 4 and not: rows of a multiple of 4 columns from such an offset
            # start every row's draws on a Philox call (the kernels' fast path), the others do not
            offset = 4 * int(rng.integers(1, 250_000)) + (int(rng.integers(1, 4)) if index % 2 else 0)
            cases.append(Case(f"{name}, p = {p:g}", inputs, dtype, tolerance,
                              kwargs={"p": p, "seed": _draw(rng, large), "offset": offset}))
    return cases


DROPOUT_TASKS = [
    Task("w39.dropout_residual", "triton", ("dropout_block", "dropout_residual_kernel",
                                            "dropout_residual_backward_kernel"), dropout_cases, ref.dropout_residual, outputs=("y", "dx"), writes_out=True, banned=DROPOUT_BANNED,
         hint=dropout_hint, dtypes=DROPOUT_DTYPES, scale=ref.dropout_residual_scale),
    Task("w39.dropout_residual_layernorm", "triton", ("dropout_block", "dropout_residual_layernorm_kernel"),
         dropout_layernorm_cases,
         ref.dropout_residual_layernorm, outputs=("y", "h", "mean", "rstd"), writes_out=True, banned=DROPOUT_BANNED,
         hint=dropout_layernorm_hint, dtypes=DROPOUT_DTYPES, scale=ref.dropout_residual_layernorm_scale),
]

# ---------------------------------------------------------------- day 5: RoPE inside attention
# rope_attention is judged against float64 RoPE followed by week 35's float64 attention. In 16 bits its tolerance is
# FlashAttention's test rule applied to the unfused composition the kernel replaces: a rotary kernel that stores q and
# k in the dtype, then PyTorch's own attention in the dtype. A failure is diagnosed by turning the case's own q, k, v
# with each known slip and attending (rope_attention_variants).
from .. import backend  # noqa: E402
from ..w35_attention_blocks.tasks import (ALL_DTYPES, MATMULS, SDPA, SOFTMAXES, STRIDES, UNIT_ROUNDOFF,  # noqa: E402
                                          _misread, normal_heads)
from ..w35_attention_blocks import reference as ref35  # noqa: E402

ROPE_PAIRS = ('RoPE pairs the two halves of the head, (x[c], x[c + d/2]) (the "rotate half" layout of the tables), '
              "not neighbours (x[2c], x[2c + 1]).")
ROPE_SIGN = "the rotation turns the wrong way: y1 = x1·cos - x2·sin and y2 = x2·cos + x1·sin (a turn by +θ)."
ROPE_COS_SIN = "cos and sin are swapped: the first half is x1·cos - x2·sin, with cos from the cos table."
ROPE_KEYS = ("the keys are not rotated (or all at position 0): each key tile turns by its keys' own positions, row j "
             "of the tables for key j, as it is loaded.")
ROPE_QUERIES = ("the queries are not rotated (or all at position 0): the prologue turns the query tile once, row i of "
                "the tables for query i.")
ROPE_NONE = "nothing is rotated: RoPE turns q and k by their positions before S = q·kᵀ."
ROPE_V = "v is rotated too: RoPE turns only q and k (positions enter through the scores); v is used as it is."
ROPE_BLOCK = ("a tile is rotated by its rows' index inside the block: the table row is the position in the sequence, "
              "block start + index.")
ROPE_SCALE_MISSING = ("the scores are not scaled: fold qk_scale = scale·log2(e) into the rotated query tile once, in "
                      "the prologue.")
ROPE_LOG2E = "exp2 needs base-2 logits: the factor is qk_scale = scale·log2(e), not the scale alone."
ROPE_SCALE_TWICE = "the scale is applied twice: the query tile carries qk_scale, so the scores need no other factor."
TILE_SIZES = (16, 32, 64, 128)


def _turned(x, cos, sin, positions, first=-1.0, second=1.0):
    """x turned with a choice of signs: (x1·cos + first·x2·sin, x2·cos + second·x1·sin) at the tables' `positions`."""
    half = x.shape[-1] // 2
    x1, x2, c, s = x[..., :half], x[..., half:], cos[positions], sin[positions]
    return np.concatenate([x1 * c + first * x2 * s, x2 * c + second * x1 * s], axis=-1)


def rope_attention_variants(q, k, v, cos, sin, causal=False) -> dict:
    """hint -> [(o, lse)] that each known slip of RoPE inside attention makes of the case's own inputs."""
    m, n, d = q.shape[2], k.shape[2], q.shape[-1]
    scale, ln2 = 1 / np.sqrt(d), np.log(2.0)
    qr, kr = ref.rotated(q, cos, sin), ref.rotated(k, cos, sin)

    def attend(a=qr, b=kr, c=v, sc=scale):
        return ref.attention_with(a, b, c, causal=causal, scale=sc)

    def both(turn):  # q and k turned by the same wrong rule
        return attend(turn(q, np.arange(m)), turn(k, np.arange(n)))

    neighbours = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])  # (2c, 2c + 1) taken as the two halves
    return {
        ROPE_PAIRS: [both(lambda x, t: _turned(x[..., neighbours], cos, sin, t))],
        ROPE_SIGN: [both(lambda x, t, f=f, s=s: _turned(x, cos, sin, t, f, s)) for f, s in ((1, -1), (1, 1), (-1, -1))],
        ROPE_COS_SIN: [both(lambda x, t: _turned(x, sin, cos, t))],
        ROPE_KEYS: [attend(b=k)],
        ROPE_QUERIES: [attend(a=q)],
        ROPE_NONE: [attend(a=q, b=k)],
        ROPE_V: [attend(c=ref.rotated(v, cos, sin))],
        ROPE_BLOCK: [attend(a=ref.rotated(q, cos, sin, np.arange(m) % t)) for t in TILE_SIZES]
        + [attend(b=ref.rotated(k, cos, sin, np.arange(n) % t)) for t in TILE_SIZES]
        + [attend(ref.rotated(q, cos, sin, np.arange(m) % bm), ref.rotated(k, cos, sin, np.arange(n) % bn))
           for bm, bn in ((32, 16), (64, 64), (128, 64))],
        ROPE_SCALE_MISSING: [attend(sc=ln2), attend(sc=1.0)],
        ROPE_LOG2E: [attend(sc=scale * ln2)],
        ROPE_SCALE_TWICE: [attend(sc=scale * scale / ln2), attend(sc=scale * scale)],
    }


def rope_attention_hint(case, got, expected):
    q, k, v, cos, sin = seen(case)
    with np.errstate(all="ignore"):
        variants = rope_attention_variants(q, k, v, cos, sin, **case.kwargs)
        if case.strided:  # one input at a time read as if contiguous
            variants[STRIDES] = [ref.rope_attention(*[wrong if j == i else x for j, x in enumerate((q, k, v))],
                                                    cos, sin, **case.kwargs)
                                 for i, x in enumerate((q, k, v)) for wrong in _misread(x)]
        return diagnose(got, expected, pick(variants, ("o", "lse").index(case.output)))


def _rounded(arrays, dtype):
    import torch
    return [torch.from_numpy(a).to(getattr(torch, dtype)).double().numpy() for a in arrays]


def composition_rule(q, k, v, cos, sin, dtype, causal=False):
    """16 bits: FlashAttention's test rule on the unfused composition (RoPE in float64 stored in the dtype, as a
    rotary kernel leaves q and k, then PyTorch's own attention in the dtype): twice its largest error on o or on
    the log-sum-exp (rounding the rotated q and k moves every logit), plus one rounding of the largest output.
    float32: None, the dtype's own tolerance."""
    if dtype == "float32":
        return None
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v, cos, sin = _rounded((q, k, v, cos, sin), dtype)
    qr, kr = ref.rotated(q, cos, sin), ref.rotated(k, cos, sin)
    o, lse = ref.attention_with(qr, kr, v, causal=causal)
    stored = [torch.from_numpy(a).to(backend.DEVICE, getattr(torch, dtype)) for a in (qr, kr, v)]
    with sdpa_kernel(SDPBackend.MATH):
        got = torch.nn.functional.scaled_dot_product_attention(*stored, is_causal=causal)
    err_o = float(np.abs(got.double().cpu().numpy() - o).max())
    err_lse = float(np.abs(ref.attention_with(*_rounded((qr, kr), dtype), v, causal=causal)[1] - lse).max())
    floor = UNIT_ROUNDOFF[dtype] * max(float(np.abs(o).max()), float(np.abs(lse).max())) + 1e-5
    return (2 * max(err_o, err_lse) + floor, 0.0, f"FlashAttention's rule on RoPE + attention unfused in {dtype}: "
            f"2 × its error on o and the log-sum-exp ({max(err_o, err_lse):.2g}) + one rounding of the largest "
            f"output ({floor:.2g})")


# (name, B, H, M, N, d, masks): the causal mask where it tells something (the interpreter's time goes to rows)
ROPE_SHAPES = (("N = 1", 1, 1, 1, 1, 16, (False,)),
               ("odd lengths (2, 3, 37, 37), d = 32", 2, 3, 37, 37, 32, (False, True)),
               ("M = 45 queries, N = 70 keys, d = 16", 1, 2, 45, 70, 16, (False, True)),
               ("M = 70, N = 45, d = 64", 1, 2, 70, 45, 64, (True,)),
               ("d = 48: halves of 24, no power of two", 1, 2, 33, 33, 48, (False,)),
               ("200 positions: many blocks, angles of many turns", 1, 1, 200, 200, 32, (True,)))


def rope_attention_cases(rng, dtypes):
    cases = []

    def add(dtype, name, b, h, m, n, d, causal, rows=None, strided=False):
        q, k = normal_heads(rng, b, h, m, n, d)
        v = rng.normal(0, 1, (b, h, n, d))
        cos, sin = ref35.rope_tables(rows or max(m, n), d)
        cases.append(Case(f"{'causal' if causal else 'no mask'}, {name}", (q, k, v, cos, sin), dtype,
                          composition_rule(q, k, v, cos, sin, dtype, causal), kwargs={"causal": causal},
                          strided=strided))
    for dtype in dtypes:
        for name, b, h, m, n, d, masks in ROPE_SHAPES:
            for causal in masks:
                add(dtype, name, b, h, m, n, d, causal)
        add(dtype, "non-contiguous q, k, v: (B, N, H, d) storage", 2, 3, 37, 37, 64, True, strided=True)
        add(dtype, "tables of 256 positions for 40 (a model's whole context)", 1, 2, 40, 40, 32, False, rows=256)
    return cases


ATTENTION_TASKS = [
    Task("w39.rope_attention", "triton", ("rotate_half_tile", "rope_attention_kernel", "_attend_rotated_keys"),
         rope_attention_cases, ref.rope_attention, outputs=("o", "lse"), banned=SOFTMAXES + SDPA + MATMULS,
         hint=rope_attention_hint, dtypes=ALL_DTYPES),
]

TASKS = {t.id: t for t in [*ACTIVATION_TASKS, *DROPOUT_TASKS, *ATTENTION_TASKS]}
