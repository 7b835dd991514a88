"""Graded tasks of week 33: the cases each exercise is swept over, and hints keyed to its pitfalls."""
import numpy as np

from ..grading import Case, Task
from . import reference as ref

BANNED = tuple(f"{m}.{f}" for m in ("torch", "torch.nn.functional", "torch.Tensor", "torch.special")
               for f in ("softmax", "log_softmax")) + (
    "torch.logsumexp", "torch.Tensor.logsumexp", "scipy.special.softmax", "scipy.special.log_softmax",
    "scipy.special.logsumexp")
ALL_DTYPES = ("float32", "float16", "bfloat16")


def _with_neg_inf(rng, shape, fraction=0.3):
    x = rng.normal(0, 3, shape)
    hole = rng.random(shape) < fraction
    hole[..., rng.integers(shape[-1])] = False  # every row keeps at least one finite logit
    x[hole] = -np.inf
    return x


def _masked_prefix(x, n):
    x[..., :n] = -np.inf
    return x


def row_cases(rng, dtypes):
    """Rows of every awkward length, plus the adversarial inputs of softmax."""
    def normal(*shape):
        return rng.normal(0, 3, shape)
    cases = []
    for dtype in dtypes:
        big = 1e4
        cases += [
            Case("one element, shape (1, 1)", (normal(1, 1),), dtype),
            Case("one row of 7", (normal(1, 7),), dtype),
            Case("random (37, 33): not a multiple of any block", (normal(37, 33),), dtype),
            Case("random (8, 1000)", (normal(8, 1000),), dtype),
            Case("random (2, 3, 129): leading dims are rows", (normal(2, 3, 129),), dtype),
            Case("long rows (3, 20000)", (normal(3, 20000),), dtype),
            Case("long rows whose first 9000 logits are -inf", (_masked_prefix(normal(2, 20000), 9000),), dtype),
            Case(f"huge logits: uniform in ±{big:g}", (rng.uniform(-big, big, (6, 257)),), dtype),
            Case(f"close huge logits: {big:g} + N(0, 2), so float32 spacing (1e-3) shows in exp(x - lse)",
                 (big + rng.normal(0, 2, (4, 300)),), dtype),
            Case("very negative rows: around -300 (exp underflows without the max)",
                 (rng.normal(-300, 1, (4, 300)),), dtype),
            Case("-inf entries (masked logits)", (_with_neg_inf(rng, (5, 100)),), dtype),
            Case("constant rows", (np.full((4, 50), 3.0),), dtype),
        ]
    return cases


def softmax_hint(case, got, expected):
    if (~np.isfinite(got)).any() and np.isfinite(expected).all():
        return ("NaN or inf where the answer is finite: exp overflowed (or 0/0). Subtract each row's max "
                "before exp." if "huge" in case.name or "negative" in case.name else
                "NaN or inf where the answer is finite: check for 0/0 and exp of a huge number.")
    if got.ndim >= 2 and np.all(np.isfinite(got)):
        ratio = got / np.where(expected == 0, np.nan, expected)
        spread = np.nanstd(ratio, axis=-1)
        if np.nanmax(spread) < 1e-3 and np.nanmax(np.abs(np.nanmean(ratio, axis=-1) - 1)) > 1e-2:
            return "every row is off by a constant factor: did you normalise by the sum of the whole row?"
        if np.allclose(got.sum(axis=-1), 1, atol=1e-2):
            return "each row sums to 1 but the values are wrong: is the max or the sum taken over the right axis?"
    return None


def log_softmax_hint(case, got, expected):
    if np.isneginf(got).any() and np.isfinite(expected).all():
        return "-inf where the answer is finite: log(softmax) underflows. Use x - max - log(sum(exp(x - max)))."
    if np.isposinf(np.abs(got)).any() or np.isnan(got).any():
        return "inf or NaN: exp overflowed. Subtract the row max before exp."
    return None


def _state_of(x):
    return ref.softmax_state(x)


def update_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for rows, width in [(1, 1), (5, 7), (64, 33)]:
            first, chunk = rng.normal(0, 2, (rows, width)), rng.normal(0, 2, (rows, width))
            empty = (np.full(rows, -np.inf), np.zeros(rows))
            cases += [
                Case(f"first chunk on the empty state, {rows} rows x {width}", (*empty, chunk), dtype),
                Case(f"running state, new chunk has larger values, {rows}x{width}", (*_state_of(first), chunk + 5), dtype),
                Case(f"running state, new chunk has smaller values, {rows}x{width}", (*_state_of(first), chunk - 5), dtype),
            ]
        big = rng.uniform(-1e4, 1e4, (6, 40))
        masked = np.full((4, 9), -np.inf)
        cases += [
            Case("huge logits: state and chunk spread over ±1e4", (*_state_of(big[:, :20]), big[:, 20:]), dtype),
            Case("-inf entries in the chunk", (*_state_of(rng.normal(0, 2, (5, 8))), _with_neg_inf(rng, (5, 8))), dtype),
            Case("fully masked chunk on the empty state: stays (-inf, 0)", (np.full(4, -np.inf), np.zeros(4), masked), dtype),
            Case("fully masked chunk on a running state: unchanged", (*_state_of(rng.normal(0, 2, (4, 3))), masked), dtype),
        ]
    return cases


def merge_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for rows in (1, 6, 65):
            a, b = rng.normal(0, 2, (rows, 11)), rng.normal(1, 2, (rows, 5))
            cases.append(Case(f"two random states, {rows} rows", (*_state_of(a), *_state_of(b)), dtype))
        a, b = rng.normal(1e4, 1, (4, 8)), rng.normal(-1e4, 1, (4, 8))
        empty = (np.full(4, -np.inf), np.zeros(4))
        cases += [
            Case("maxima 2e4 apart (a far above b)", (*_state_of(a), *_state_of(b)), dtype),
            Case("maxima 2e4 apart (b far above a)", (*_state_of(b), *_state_of(a)), dtype),
            Case("empty state on the left", (*empty, *_state_of(b)), dtype),
            Case("empty state on the right", (*_state_of(a), *empty), dtype),
            Case("both states empty: stays (-inf, 0)", (*empty, *empty), dtype),
        ]
    return cases


def state_hint(case, got, expected):
    if np.isnan(got).any():
        return ("NaN: for an empty row, m = -inf and exp(m - m_new) is exp(-inf - (-inf)) = NaN. "
                "Shift by 0 where the new max is -inf.")
    if np.isinf(got).any() and np.isfinite(expected).all():
        return "inf: the old sum must be rescaled by exp(m_old - m_new) before adding the new terms."
    return None


def _softmax_task(name, backend, regions, dtypes, reference=ref.softmax, hint=softmax_hint):
    return Task(f"w33.{name}", backend, regions, row_cases, lambda x: (reference(x),), writes_out=backend != "numpy",
                banned=BANNED, hint=hint, dtypes=dtypes)


TASKS = {t.id: t for t in [
    _softmax_task("stable_softmax", "numpy", ("stable_softmax",), ("float64", "float32")),
    _softmax_task("block_softmax", "cuda", ("BLOCK_SOFTMAX_SRC",), ALL_DTYPES),
    _softmax_task("warp_softmax", "cuda", ("WARP_SOFTMAX_SRC",), ALL_DTYPES),
    _softmax_task("triton_softmax", "triton", ("softmax_kernel",), ALL_DTYPES),
    Task("w33.online_softmax_update", "numpy", ("online_softmax_update",), update_cases,
         lambda m, l, x: ref.merge_states(m, l, *ref.softmax_state(x)), outputs=("m", "l"), banned=BANNED,
         hint=state_hint, dtypes=("float64", "float32")),
    Task("w33.merge_softmax_states", "numpy", ("merge_softmax_states",), merge_cases,
         ref.merge_states, outputs=("m", "l"), banned=BANNED, hint=state_hint, dtypes=("float64", "float32")),
    _softmax_task("online_softmax", "triton", ("online_softmax_kernel",), ALL_DTYPES),
    _softmax_task("log_softmax", "triton", ("log_softmax_kernel",), ALL_DTYPES,
                  reference=ref.log_softmax, hint=log_softmax_hint),
]}
