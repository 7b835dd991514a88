"""Graded tasks of week 34: the cases each exercise is swept over, and a diagnosis of a failure: the output is compared
with what each known bug (one-pass variance, Chan without δ², eps outside the root, dx without its mean terms, ...)
would have produced on the same inputs."""
import warnings

import numpy as np

from ..grading import Case, Task, diagnose, pick, seen
from . import reference as ref
from .reference import EPS

BANNED = tuple(f"torch.nn.functional.{f}" for f in ("layer_norm", "rms_norm", "group_norm")) + (
    "torch.layer_norm", "torch.rms_norm", "torch.var", "torch.var_mean", "torch.std", "torch.Tensor.var",
    "torch.Tensor.std", "numpy.var", "numpy.std", "numpy.nanvar")
ALL_DTYPES = ("float32", "float16", "bfloat16")
OFFSET = 1e4
# A float32 row at 1e4 has spacing 1e-3; its mean in float32 is off by up to a few 1e-4. That error moves
# every (x - mean) / σ by (error / σ), so the offset case is graded at what float32 can represent.
OFFSET_SPREAD = {"float64": 1.0, "float32": 10.0, "float16": 30.0, "bfloat16": 100.0}
_WHY = ("rows at 1e4: the float32 mean itself is off by up to ~5e-4 (half its spacing), which every "
        "(x - mean) / σ inherits at σ = {}")
OFFSET_TOLERANCE = {"float32": (2e-3, 5e-4, _WHY.format(10)), "float16": (2e-4, 2e-3, _WHY.format(30)),
                    "bfloat16": (1e-4, 1.6e-2, _WHY.format(100))}


def _offset(rng, shape, dtype):
    return OFFSET + rng.normal(0, OFFSET_SPREAD[dtype], shape)


def _rows(rng, dtype):
    """(name, x, tolerance) for every row shape and adversarial input of the norms."""
    normal = lambda *shape: rng.normal(0, 2, shape)  # noqa: E731
    return [
        ("N = 1, shape (1, 1)", normal(1, 1), None),
        ("one row of 7", normal(1, 7), None),
        ("random (37, 33): not a multiple of any block", normal(37, 33), None),
        ("random (8, 1000)", normal(8, 1000), None),
        ("random (2, 3, 129): leading dims are rows", normal(2, 3, 129), None),
        ("long rows (3, 5000)", normal(3, 5000), None),
        (f"large offset: {OFFSET:g} + N(0, {OFFSET_SPREAD[dtype]:g}^2), where E[x²] - E[x]² cancels",
         _offset(rng, (6, 300), dtype), OFFSET_TOLERANCE.get(dtype)),
        ("constant rows (variance 0)", np.full((4, 50), 3.0), None),
        ("tiny rows (scale 1e-3): eps is not negligible", rng.normal(0, 1e-3, (4, 64)), None),
    ]


def _params(rng, n):
    return rng.normal(1, 0.5, n), rng.normal(0, 0.5, n)


def variance_cases(rng, dtypes):
    return [Case(name, (x,), dtype, tol) for dtype in dtypes for name, x, tol in _rows(rng, dtype)]


def merge_cases(rng, dtypes):
    def state(x):
        mean, var = ref.mean_var(x)
        return np.full(x.shape[:-1], float(x.shape[-1])), mean, var * x.shape[-1]
    cases = []
    for dtype in dtypes:
        empty = (np.zeros(5), np.zeros(5), np.zeros(5))
        a, b = rng.normal(0, 2, (5, 13)), rng.normal(3, 1, (5, 4))
        big, small = rng.normal(0, 1, (5, 1000)), rng.normal(5, 1, (5, 1))
        cases += [
            Case("two parts of 13 and 4 columns", (*state(a), *state(b)), dtype),
            Case("1000 columns and 1 column", (*state(big), *state(small)), dtype),
            Case("1 column and 1000 columns", (*state(small), *state(big)), dtype),
            Case(f"parts at {OFFSET:g} with means 2 apart", (*state(OFFSET + a), *state(OFFSET + 2 + b)), dtype,
                 OFFSET_TOLERANCE.get(dtype)),
            Case("empty part on the left", (*empty, *state(b)), dtype),
            Case("empty part on the right", (*state(a), *empty), dtype),
            Case("both parts empty: stays (0, 0, 0)", (*empty, *empty), dtype),
        ]
    return cases


def _norm_cases(build):
    def cases(rng, dtypes):
        out = []
        for dtype in dtypes:
            for name, x, tol in _rows(rng, dtype):
                out.append(Case(name, build(rng, x), dtype, tol))
        return out
    return cases


def _with_affine(rng, x):
    return (x, *_params(rng, x.shape[-1]))


def _with_weight(rng, x):
    return (x, _params(rng, x.shape[-1])[0])


def _with_weight_and_grad(rng, x):
    return (x, _params(rng, x.shape[-1])[0], rng.normal(0, 1, x.shape))


def _with_residual(rng, x):
    return (x, rng.normal(0, 2, x.shape), _params(rng, x.shape[-1])[0])


# ---------------------------------------------------------------- diagnosis: what known bugs produce
# Each *_variants function maps a hint to what a known bug makes of an output on the case's own inputs (an array,
# or a list of the forms the bug can take), computed in float64 from reference.py's formulas; `grading.diagnose` names the
# bug whose output the learner's matches. A bug whose output this case cannot tell from the right one is left out.
def _welford(x, step=lambda count: count, m2_term=lambda delta, value, mean: delta * (value - mean)):
    """Welford's loop over the columns of x in float64, with the mean's step divisor and the M2 term as given."""
    count, mean, m2 = 0, np.zeros(x.shape[:-1]), np.zeros(x.shape[:-1])
    for j in range(x.shape[-1]):
        value = x[..., j]
        count += 1
        delta = value - mean
        mean = mean + delta / step(count)
        m2 = m2 + m2_term(delta, value, mean)
    return mean, m2 / count


ONE_PASS = ("E[x²] − E[x]² cancels catastrophically when the mean is large against the spread: update a running "
            "M2 with Welford's step, delta = x − mean (old), mean += delta / count, M2 += delta·(x − mean (new)).")


def variance_variants(x):
    n = x.shape[-1]
    mean, var = ref.mean_var(x)
    return {
        "did you divide M2 by n − 1? LayerNorm uses the population variance: M2 / n.": [(mean, var * n / max(n - 1, 1))],
        "M2 grew by delta² (the old mean twice): the Welford step is M2 += delta·(x − mean) with the mean "
        "already updated.": [_welford(x, m2_term=lambda delta, value, mean: delta * delta)],
        "M2 grew by (x − mean)² with the new mean twice: the Welford step is M2 += delta·(x − mean (new)), "
        "delta taken before the mean moved.": [_welford(x, m2_term=lambda delta, value, mean: (value - mean) ** 2)],
        "the mean's step divides by count + 1: after count += 1, the step is delta / count.":
            [_welford(x, step=lambda count: count + 1)],
    }


def _cancelled(x, dtype, got, var):
    """Whether the wrong variance has the size of E[x²] − E[x]²'s rounding error in `dtype`: the rows are far from
    zero against their spread, and the error is within n·eps·E[x²] (what summing n squares can lose)."""
    n, square = x.shape[-1], (x * x).mean(axis=-1)
    if n < 2 or not ((x.mean(axis=-1) ** 2 > 100 * var).all() and np.isfinite(got).all()):
        return False
    return bool((np.abs(got - var) <= n * np.finfo(dtype).eps * square).all())


def variance_hint(case, got, expected):
    (x,) = seen(case)
    index = ("mean", "var").index(case.output)
    found = diagnose(got, expected, pick(variance_variants(x), index))
    if found is None and case.output == "var" and _cancelled(x, case.dtype, got, expected):
        return ONE_PASS
    return found


def merge_variants(n_a, mean_a, m2_a, n_b, mean_b, m2_b):
    n, mean, m2 = ref.chan_merge(n_a, mean_a, m2_a, n_b, mean_b, m2_b)
    delta = mean_b - mean_a
    share_b = n_b / np.where(n == 0, 1, n)
    with np.errstate(all="ignore"):
        nan_mean = mean_a + delta * (n_b / n)
        nan_m2 = m2_a + m2_b + delta ** 2 * n_a * n_b / n
    return {
        "the δ² term is missing: M2 = M2_a + M2_b + δ²·n_a·n_b / n with δ = mean_b − mean_a (the parts' means "
        "differ, so the union spreads wider than either part)": [(n, mean, m2_a + m2_b)],
        "δ² is weighted by n_b / n: it is δ²·n_a·n_b / n": [(n, mean, m2_a + m2_b + delta ** 2 * share_b)],
        "δ²·n_a·n_b is not divided by n = n_a + n_b": [(n, mean, m2_a + m2_b + delta ** 2 * n_a * n_b)],
        "δ is not squared in the M2 term: δ²·n_a·n_b / n": [(n, mean, m2_a + m2_b + delta * n_a * share_b)],
        "the means were averaged without their counts: mean = mean_a + δ·n_b / n": [(n, (mean_a + mean_b) / 2, m2)],
        "the mean moved by n_a / n instead of n_b / n: mean = mean_a + δ·n_b / n": [(n, mean_a + delta * (1 - share_b),
                                                                                   m2)],
        "NaN where both parts are empty: n = n_a + n_b is 0 there, guard the division (the union stays (0, 0, 0))":
            [(n, nan_mean, nan_m2), (n, nan_mean, m2), (n, mean, nan_m2)],
    }


def merge_hint(case, got, expected):
    index = ("n", "mean", "m2").index(case.output)
    return diagnose(got, expected, pick(merge_variants(*seen(case)), index))


EPS_INSIDE = ("eps belongs inside the square root: rstd = 1 / sqrt({} + eps) (outside it, or left out, it no longer "
              "bounds rstd on tiny or constant rows)")


def _stats(x):
    """Per-row mean, variance and mean square (float64), with a trailing axis for broadcasting."""
    mean, var = ref.mean_var(x)
    return mean[..., None], var[..., None], (x * x).mean(axis=-1, keepdims=True)


def _padded(n):
    return 1 << max(0, n - 1).bit_length()  # triton.next_power_of_2


def _threads_m2(x, threads=256):
    """Σ over the threads of each thread's own M2, thread t holding columns t, t + threads, ...: what a tree of
    Chan merges that drop the δ² term leaves (the sum of the parts' M2, whatever the order)."""
    n = x.shape[-1]
    width = -(-n // threads) * threads
    padded = np.concatenate([x, np.full((*x.shape[:-1], width - n), np.nan)], axis=-1)
    grouped = padded.reshape(*x.shape[:-1], width // threads, threads)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        centred = grouped - np.nanmean(grouped, axis=-2, keepdims=True)
    return np.nansum(centred ** 2, axis=(-2, -1))[..., None]


def layernorm_variants(x, w, b):
    """hint -> y of the forward's known bugs (the CUDA kernel: block-per-row Welford, a tree of Chan merges)."""
    n = x.shape[-1]
    mean, var, _ = _stats(x)
    c = x - mean
    with np.errstate(all="ignore"):
        y = lambda rstd, centred=c: centred * rstd * w + b  # noqa: E731
        return {
            EPS_INSIDE.format("var"): [y(1 / np.sqrt(var) + EPS), y(1 / (np.sqrt(var) + EPS)), y(1 / np.sqrt(var))],
            "did you divide M2 by n − 1? LayerNorm uses the population variance, M2 / n":
                y(1 / np.sqrt(var * n / max(n - 1, 1) + EPS)),
            "the merge dropped Chan's δ² term: M2 = M2_a + M2_b + δ²·n_a·n_b / n, δ = mean_b − mean_a":
                y(1 / np.sqrt(_threads_m2(x) / n + EPS)),
            "the square root is missing: rstd = 1 / sqrt(var + eps)": y(1 / (var + EPS)),
            "the bias is not added: y = (x − mean)·rstd·w + b": y(1 / np.sqrt(var + EPS)) - b,
            "the weight is not applied: y = (x − mean)·rstd·w + b": c / np.sqrt(var + EPS) + b,
            "the mean is not subtracted: y = (x − mean)·rstd·w + b": y(1 / np.sqrt(var + EPS), x),
        }


def rms_variants(x, w):
    """hint -> [(y, rstd)] of RMSNorm's known bugs."""
    n = x.shape[-1]
    mean, var, square = _stats(x)
    form = lambda rstd, scale=w: [(x * rstd * scale, rstd[..., 0])]  # noqa: E731
    with np.errstate(all="ignore"):
        right = 1 / np.sqrt(square + EPS)
        return {
            EPS_INSIDE.format("mean(x²)"): form(1 / np.sqrt(square) + EPS) + form(1 / (np.sqrt(square) + EPS))
            + form(1 / np.sqrt(square)),
            "RMSNorm divides by the root mean square, not the standard deviation: rstd = 1 / sqrt(mean(x²) + eps), "
            "with no mean subtracted": form(1 / np.sqrt(var + EPS)) + [((x - mean) / np.sqrt(var + EPS) * w,
                                                                         1 / np.sqrt(var[..., 0] + EPS))],
            "the mean of the squares divides by the padded block: divide by n_cols, the row's real length":
                form(1 / np.sqrt(square * n / _padded(n) + EPS)),
            "the mean of the squares divides by n − 1: it is mean(x²) = Σ x² / n":
                form(1 / np.sqrt(square * n / max(n - 1, 1) + EPS)),
            "the sum of the squares is not divided by n: rstd = 1 / sqrt(Σ x² / n + eps)":
                form(1 / np.sqrt(square * n + EPS)),
            "the square root is missing: rstd = 1 / sqrt(mean(x²) + eps)": form(1 / (square + EPS)),
            "the weight is not applied: y = x·rstd·w": form(right, 1.0),
            "rstd is the reciprocal: store 1 / sqrt(mean(x²) + eps), the factor y = x·rstd·w uses":
                [(x * right * w, 1 / right[..., 0])],
        }


def rms_hint(case, got, expected):
    return diagnose(got, expected, pick(rms_variants(*seen(case)), ("y", "rstd").index(case.output)))


def fused_variants(x, r, w):
    """hint -> [(y, h)] of the fused residual add + RMSNorm's known bugs: RMSNorm's on h = x + residual, and the
    add's own."""
    h = x + r
    rstd = 1 / np.sqrt((h * h).mean(axis=-1, keepdims=True) + EPS)
    out = {hint: [(y, h) for y, _ in forms] for hint, forms in rms_variants(h, w).items()}
    out["y normalises x: RMSNorm applies to h = x + residual"] = [(x * rstd * w, h), (ref.rmsnorm(x, w)[0], h)]
    out["h must be x + residual: the sum, stored, is the next block's residual"] = [(ref.rmsnorm(h, w)[0], x),
                                                                                    (ref.rmsnorm(h, w)[0], r)]
    out["y was stored as h: h is x + residual, before the norm"] = [(ref.rmsnorm(h, w)[0], ref.rmsnorm(h, w)[0])]
    return out


def fused_hint(case, got, expected):
    return diagnose(got, expected, pick(fused_variants(*seen(case)), ("y", "h").index(case.output)))


def dx_variants(x, w, dy):
    """hint -> dx of LayerNorm's backward with a known slip in dx = rstd·(w·dy − mean(w·dy) − x̂·mean(x̂·w·dy))."""
    n = x.shape[-1]
    mean, var, _ = _stats(x)
    rstd = 1 / np.sqrt(var + EPS)
    xhat, g = (x - mean) * rstd, w * dy
    avg = lambda t: t.mean(axis=-1, keepdims=True)  # noqa: E731
    dx = lambda g=g, c1=avg(xhat * g), c2=avg(g), r=rstd: (g - xhat * c1 - c2) * r  # noqa: E731
    return {
        "the mean(w·dy) term is missing (that is RMSNorm's dx): dx = rstd·(w·dy − mean(w·dy) − x̂·mean(x̂·w·dy))":
            dx(c2=0.0),
        "the x̂·mean(x̂·w·dy) term is missing: dx = rstd·(w·dy − mean(w·dy) − x̂·mean(x̂·w·dy))": dx(c1=0.0),
        "both mean terms are missing (that is dx with mean and rstd held fixed): dx = rstd·(w·dy − mean(w·dy) − "
        "x̂·mean(x̂·w·dy))": dx(c1=0.0, c2=0.0),
        "dx is not multiplied by rstd: dx = rstd·(w·dy − mean(w·dy) − x̂·mean(x̂·w·dy))": dx(r=1.0),
        "the mean term takes dy where it needs w·dy: mean(w·dy)": dx(c2=avg(dy)),
        "the x̂ term takes x̂·dy where it needs x̂·w·dy: mean(x̂·w·dy)": dx(c1=avg(xhat * dy)),
        "the weight is missing: every dy in the formula is w·dy": dx(g=dy, c1=avg(xhat * dy), c2=avg(dy)),
        "the two row sums are not divided by n: they are means, Σ / n_cols": dx(c1=n * avg(xhat * g), c2=n * avg(g)),
        "the row sums are divided by the padded block: divide by n_cols, the row's real length":
            dx(c1=avg(xhat * g) * n / _padded(n), c2=avg(g) * n / _padded(n)),
    }


def dx_hint(case, got, expected):
    x, w, dy = seen(case)
    found = diagnose(got, expected, dx_variants(x, w, dy))
    if found or x.shape[-1] < 2:
        return found
    # No known slip: is only the per-row constant term wrong (the x̂ term and rstd right)?
    mean, var, _ = _stats(x)
    rstd = 1 / np.sqrt(var + EPS)
    xhat, g = (x - mean) * rstd, w * dy
    kept = g - xhat * (xhat * g).mean(axis=-1, keepdims=True)
    constant = (kept - got / rstd).mean(axis=-1, keepdims=True)
    return diagnose(got, expected, {"the per-row constant term is off: dx = rstd·(w·dy − mean(w·dy) − x̂·mean(x̂·w·dy)) "
                                     "with mean(w·dy) = Σ w·dy / n_cols": (kept - constant) * rstd})


def _part_rows(x, w, dy, dtype) -> list:
    """Stage 1 of the weight gradients as norm_backward lays it out, for each program count it may choose: [P, 2N]
    partial rows (dγ's N columns, then dβ's) of programs owning R consecutive rows each. Programs: 2 per SM for
    rows of at most 8 KB, else 1; 3 SMs on CPU, the device's count on a GPU."""
    rows, n = x.reshape(-1, x.shape[-1]), x.shape[-1]
    mean, var, _ = _stats(rows)
    terms = np.concatenate([dy.reshape(rows.shape) * (rows - mean) / np.sqrt(var + EPS), dy.reshape(rows.shape)], -1)
    sms = {3}
    import torch
    if torch.cuda.is_available():
        sms.add(torch.cuda.get_device_properties(0).multi_processor_count)
    per_sm = 2 if n * np.dtype(np.float16 if dtype in ("float16", "bfloat16") else dtype).itemsize <= 8192 else 1
    layouts = []
    for programs in sorted({per_sm * s for s in sms}):
        r = -(-len(rows) // min(programs, len(rows)))
        layouts.append(np.stack([terms[p:p + r].sum(axis=0) for p in range(0, len(rows), r)]))
    return layouts


def weight_grad_variants(x, w, dy, dtype):
    """hint -> [(dweight, dbias)] of stage 2's known slips (weight_grad_kernel summing [P, 2N] partial rows)."""
    n = x.shape[-1]
    out = {}

    def add(hint, sums):
        out.setdefault(hint, []).append((sums[:n], sums[n:]))
    for parts in _part_rows(x, w, dy, dtype):
        p = len(parts)
        block_n = min(32, _padded(2 * n))
        if p > 1:
            add("the last partial row is left out: parts run from 0 to n_parts − 1 inclusive (mask parts < n_parts)",
                parts[:-1].sum(axis=0))
        for block_p in (4, 32):
            if p > block_p:
                add("only the first BLOCK_P partial rows are summed: loop over all n_parts, BLOCK_P at a time",
                    parts[:block_p].sum(axis=0))
                add("the running total is overwritten at each step: add each tile's sum into it (total += …)",
                    parts[(p - 1) // block_p * block_p:].sum(axis=0))
        flat = parts.reshape(-1)
        if block_n != 2 * n and (p - 1) * block_n + 2 * n <= flat.size:
            add("partial row p starts at p·n_cols (its real width), not p·BLOCK_N",
                flat[np.arange(p)[:, None] * block_n + np.arange(2 * n)[None, :]].sum(axis=0))
        if block_n == 32 and 2 * n >= 32:  # BLOCK_P = BLOCK_N = 32 on a GPU: a sum over axis 1 still fits total
            strips = -(-2 * n // 32)
            wide = np.zeros((-(-p // 32) * 32, strips * 32))
            wide[:p, :2 * n] = parts
            across = wide.reshape(-1, 32, strips, 32).sum(axis=(0, 3)).T.reshape(-1)[:2 * n]
            add("the tile was summed over its columns (axis 1): sum over the parts, axis 0", across)
    return out


def weight_grad_hint(case, got, expected):
    x, w, dy = seen(case)
    variants = weight_grad_variants(x, w, dy, case.dtype)
    return diagnose(got, expected, pick(variants, ("dweight", "dbias").index(case.output)))


def cuda_layernorm_hint(case, got, expected):
    return diagnose(got, expected, layernorm_variants(*seen(case)))


def _norm_task(name, backend, regions, cases, reference, outputs, hint, writes_out=True, scale=None):
    return Task(f"w34.{name}", backend, regions, cases, reference, outputs=outputs, writes_out=writes_out,
                banned=BANNED, hint=hint, dtypes=ALL_DTYPES, scale=scale)


TASKS = {t.id: t for t in [
    Task("w34.welford_variance", "numpy", ("welford_variance",), variance_cases, ref.mean_var,
         outputs=("mean", "var"), banned=BANNED, hint=variance_hint, dtypes=("float64", "float32")),
    Task("w34.chan_merge", "numpy", ("chan_merge",), merge_cases, ref.chan_merge, outputs=("n", "mean", "m2"),
         banned=BANNED, hint=merge_hint, dtypes=("float64", "float32")),
    _norm_task("cuda_layernorm", "cuda", ("CUDA_LAYERNORM_SRC",), _norm_cases(_with_affine),
               lambda x, w, b: ref.layernorm(x, w, b)[:1], ("y",), cuda_layernorm_hint),
    _norm_task("rmsnorm", "triton", ("rmsnorm_kernel",), _norm_cases(_with_weight), ref.rmsnorm, ("y", "rstd"),
               rms_hint),
    _norm_task("layernorm_dx", "triton", ("normalized_grad",), _norm_cases(_with_weight_and_grad),
               lambda x, w, dy: ref.norm_backward(x, w, dy)[:1], ("dx",), dx_hint, writes_out=False,
               scale=lambda x, w, dy: ref.norm_backward_scale(x, w, dy)[:1]),
    _norm_task("norm_weight_grad", "triton", ("weight_grad_kernel",), _norm_cases(_with_weight_and_grad),
               lambda x, w, dy: ref.norm_backward(x, w, dy)[1:], ("dweight", "dbias"), weight_grad_hint,
               writes_out=False, scale=lambda x, w, dy: ref.norm_backward_scale(x, w, dy)[1:]),
    _norm_task("fused_add_rmsnorm", "triton", ("fused_add_rmsnorm_kernel",), _norm_cases(_with_residual),
               ref.fused_add_rmsnorm, ("y", "h"), fused_hint),
]}
