"""Graded tasks of week 34: the cases each exercise is swept over, and hints keyed to its pitfalls."""
import numpy as np

from ..grading import Case, Task
from . import reference as ref

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


def variance_hint(case, got, expected):
    if np.isnan(got).any() or (got < 0).any():
        return "negative or NaN variance: E[x²] - E[x]² cancels catastrophically; update a running M2 instead."
    if got.size and np.allclose(got, expected * np.maximum(1, case.inputs[0].shape[-1]) /
                                max(1, case.inputs[0].shape[-1] - 1), rtol=1e-3):
        return "off by n/(n-1): LayerNorm uses the population variance (divide M2 by n, not n - 1)."
    return None


def _norm_hint(centred: bool):
    def hint(case, got, expected):
        if case.name.startswith("tiny"):
            return "only the tiny rows are wrong: eps belongs inside the square root, 1/sqrt(var + eps)."
        if case.name.startswith("large offset") and centred:
            return "the large-offset rows are wrong: compute the variance from centred values (x - mean)."
        if case.inputs[0].shape[-1] in (7, 33, 129, 1000, 5000):
            return "a width that is not a power of two is wrong: divide by the row length n_cols, not by the " \
                   "block size, and mask the padding lanes."
        return None
    return hint


def merge_hint(case, got, expected):
    if "empty" in case.name and np.isnan(got).any():
        return "NaN with an empty part: guard the division by n = n_a + n_b when both counts are 0."
    return None


def _norm_task(name, backend, regions, cases, reference, outputs, writes_out=True, scale=None, centred=True):
    return Task(f"w34.{name}", backend, regions, cases, reference, outputs=outputs, writes_out=writes_out,
                banned=BANNED, hint=_norm_hint(centred), dtypes=ALL_DTYPES, scale=scale)


TASKS = {t.id: t for t in [
    Task("w34.welford_variance", "numpy", ("welford_variance",), variance_cases, ref.mean_var,
         outputs=("mean", "var"), banned=BANNED, hint=variance_hint, dtypes=("float64", "float32")),
    Task("w34.chan_merge", "numpy", ("chan_merge",), merge_cases, ref.chan_merge, outputs=("n", "mean", "m2"),
         banned=BANNED, hint=merge_hint, dtypes=("float64", "float32")),
    _norm_task("cuda_layernorm", "cuda", ("CUDA_LAYERNORM_SRC",), _norm_cases(_with_affine),
               lambda x, w, b: ref.layernorm(x, w, b)[:1], ("y",)),
    _norm_task("rmsnorm", "triton", ("rmsnorm_kernel",), _norm_cases(_with_weight), ref.rmsnorm, ("y", "rstd"),
               centred=False),
    _norm_task("layernorm_dx", "triton", ("normalized_grad",), _norm_cases(_with_weight_and_grad),
               lambda x, w, dy: ref.norm_backward(x, w, dy)[:1], ("dx",), writes_out=False,
               scale=lambda x, w, dy: ref.norm_backward_scale(x, w, dy)[:1]),
    _norm_task("norm_weight_grad", "triton", ("weight_grad_kernel",), _norm_cases(_with_weight_and_grad),
               lambda x, w, dy: ref.norm_backward(x, w, dy)[1:], ("dweight", "dbias"), writes_out=False,
               scale=lambda x, w, dy: ref.norm_backward_scale(x, w, dy)[1:]),
    _norm_task("fused_add_rmsnorm", "triton", ("fused_add_rmsnorm_kernel",), _norm_cases(_with_residual),
               ref.fused_add_rmsnorm, ("y", "h"), centred=False),
]}
