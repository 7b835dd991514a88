"""Graded tasks of week 33: the cases each exercise is swept over, and the hints that diagnose a failure.

A hint is a diagnosis, not a guess: for each known bug, this module computes what that bug makes of the failing
case's own inputs (as rounded to the case's dtype, in the precision a kernel computes in), and names the bug whose
wrong answer the learner's output matches (grading.diagnose). A case on which a bug gives the right answer
cannot tell it apart, and gets no hint from it.
"""
import numpy as np

from ..grading import OR, Case, Task, diagnose, seen
from ..grading import matching_bugs as matches
from . import reference as ref

BANNED = tuple(f"{m}.{f}" for m in ("torch", "torch.nn.functional", "torch.Tensor", "torch.special")
               for f in ("softmax", "log_softmax")) + (
    "torch.logsumexp", "torch.Tensor.logsumexp", "scipy.special.softmax", "scipy.special.log_softmax",
    "scipy.special.logsumexp")
ALL_DTYPES = ("float32", "float16", "bfloat16")
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
FLOAT16_MAX = 65504.0


# ---------------------------------------------------------------- cases
def _with_neg_inf(rng, shape, fraction=0.3):
    x = rng.normal(0, 3, shape)
    hole = rng.random(shape) < fraction
    hole[..., rng.integers(shape[-1])] = False  # every row keeps at least one finite logit
    x[hole] = -np.inf
    return x


def _masked_prefix(x, n):
    x[..., :n] = -np.inf
    return x


def _far_apart_rows(rng, shape=(4, 50)):
    """Rows around +400, -400, 0 and +20: more than 745 apart, so exp(x - the largest logit of the whole tensor)
    underflows to 0 even in float64 for some rows, while each row's own max keeps every row finite."""
    return rng.normal(0, 3, shape) + np.array([400.0, -400.0, 0.0, 20.0])[:, None]


def _equal_then_random(rng, n):
    """Two rows of n logits, n past 65504: equal ones (the sum of exp(x - max) is n, so a float16 sum overflows),
    then random ones of spread 0.1 (a sum near 0.66·n that does not, and probabilities as small as the first
    row's, so that its error is not lost next to larger ones)."""
    return np.stack([np.full(n, 2.0), rng.normal(0, 0.1, n)])


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
            Case("rows of very different scale: around +400, -400, 0 and +20", (_far_apart_rows(rng),), dtype),
            Case("-inf entries (masked logits)", (_with_neg_inf(rng, (5, 100)),), dtype),
            Case("constant rows", (np.full((4, 50), 3.0),), dtype),
        ]
        if dtype == "float16":  # equal logits, then random ones: a float16 sum overflows on the first row only
            cases.append(Case("two float16 rows of 65536: equal logits (their sum, 65536, is past float16's largest "
                              "finite value, 65504), then random ones", (_equal_then_random(rng, 65536),), dtype))
    return cases


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


# ---------------------------------------------------------------- diagnosis: shared by every hint below
def _work(dtype: str):
    """The precision the code computes in: float64 for NumPy float64, float32 everywhere else (the kernels
    convert 16-bit inputs to float32), so that a wrong answer overflows or underflows where the code's would."""
    return np.float64 if dtype == "float64" else np.float32


def _exp(a, work):
    with np.errstate(all="ignore"):
        return np.exp(np.asarray(a, dtype=work))


def _ratio(a, b):
    with np.errstate(all="ignore"):
        return np.asarray(a / b, dtype=np.float64)


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _pad_widths(n: int) -> list:
    """Widths a kernel may pad a row of n columns to: the next power of two (16 at least, as the launchers
    choose) and the next multiple of common block sizes."""
    widths = {max(16, _next_pow2(n)), _next_pow2(n)} | {-(-n // b) * b for b in (32, 128, 256, 1024, 8192)}
    return sorted(w for w in widths if w > n)


# ---------------------------------------------------------------- known wrong softmaxes
NO_MAX = ("exp overflowed or underflowed: did you subtract each row's max before exp? exp(x) is inf past x ≈ 88 "
          "in float32 (inf / inf = NaN) and 0 far below 0 (0 / 0 = NaN); softmax(x) = exp(x - max) / Σ exp(x - max).")
MAX_TWICE = ("each row is off by the factor exp(-max): the max is counted twice. log Σ exp(x) already contains it; "
             "lse = max + log Σ exp(x - max), so shift inside the exp as well.")
UNNORMALISED = ("each row is off by a constant factor: exp(x - max) was not divided by the row's sum "
                "Σ exp(x - max).")
WHOLE_SUM = ("each row is divided by the sum over the whole tensor: every row needs its own sum, along the last "
             "axis only (axis=-1, keepdims=True).")
COLUMN_SUM = "each column sums to 1 instead of each row: take the sum along the last axis (axis=-1)."
COLUMN_MAX = ("the max is taken along the wrong axis: each row must subtract its own max, along the last axis "
              "(axis=-1, keepdims=True), not a column's.")
GLOBAL_MAX = ("did you subtract one max for the whole tensor? Rows far below its largest logit underflow to 0 / 0 "
              "(NaN) and rows of other scales lose precision; subtract each row's own max (axis=-1, keepdims=True).")
ZERO_PAD = ("the padding lanes past the row's end count as logits of 0: they join the max and the sum. Load them as "
            "-inf (other=-float(\"inf\") in tl.load, -INFINITY in CUDA C) so they add exp(-inf) = 0.")
UNMASKED = ("each row's max and sum include the logits after its end (the next row's): mask the load to the row's "
            "own columns (cols < n_cols) and fill the rest with -inf.")
LSE_ROUNDED = ("off by up to 5e-4 where the logits are large: lse = max + log Σ exp(x - max) is rounded to float32 "
               "at the scale of the max (spacing 1e-3 at 1e4), and exp(x - lse) inherits that rounding. Divide "
               "exp(x - max) by the sum instead, or carry lse's rounding error.")
FP16_SUM = ("the row sum is accumulated in float16: on this row Σ exp(x - max) = 65536 is past float16's largest "
            "finite value (65504), so it overflows (or a running float16 sum stops growing). Keep the exponentials "
            "and their sum in float32 (convert before tl.sum); round to float16 only at the store.")


def _softmax_by(x, shift, work):
    """exp(x - shift) over its row sum, in the working precision."""
    e = _exp(x - shift, work)
    return _ratio(e, e.sum(axis=-1, keepdims=True))


def _zero_padded(x, width, work, log=False):
    """Softmax (or log-softmax) of each row with zeros appended up to `width` columns, on the row's columns."""
    p = width - x.shape[-1]
    top = np.maximum(x.max(axis=-1, keepdims=True), 0.0)
    e = _exp(x - top, work)
    total = e.sum(axis=-1, keepdims=True) + p * _exp(-top, work)
    with np.errstate(all="ignore"):
        return np.asarray(x - top - np.log(total) if log else e / total, dtype=np.float64)


def _unmasked(x, got, width, log=False):
    """Softmax (or log-softmax) of the `width` logits from each row's start on, running into the next rows; rows
    whose window runs past the end of the tensor are left as they came (what lies there is unknown)."""
    n = x.shape[-1]
    rows, flat, out = x.reshape(-1, n), x.reshape(-1), got.reshape(-1, n).copy()
    known = [r for r in range(len(rows)) if r * n + width <= flat.size]
    if len(known) < max(2, len(rows) // 2):
        return []
    window = np.stack([flat[r * n:r * n + width] for r in known])
    top = window.max(axis=-1, keepdims=True)
    total = np.exp(window - top).sum(axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        out[known] = rows[known] - top - np.log(total) if log else np.exp(rows[known] - top) / total
    return [out.reshape(x.shape)]


def _fp16_sums(e32):
    """The row sums of float32 terms as float16 code gets them: terms rounded to float16, then summed exactly and
    rounded once (a tree; the interpreter's NumPy sum), or summed one after another in float16 (a loop)."""
    e16 = e32.astype(np.float16)
    with np.errstate(all="ignore"):
        tree = e16.sum(axis=-1, keepdims=True, dtype=np.float16)
        loop = np.add.accumulate(e16, axis=-1, dtype=np.float16)[..., -1:]
    return [tree.astype(np.float32), loop.astype(np.float32)]


def softmax_variants(x, dtype: str, got, bugs: tuple) -> dict:
    """hint -> what each known bug in `bugs` makes of x (rounded to dtype), in the code's precision."""
    work = _work(dtype)
    top = x.max(axis=-1, keepdims=True)
    e = _exp(x - top, work)
    widths = _pad_widths(x.shape[-1])
    out = {}
    for bug in bugs:
        if bug == NO_MAX:
            out[bug] = _softmax_by(x, 0.0, work)
        elif bug == MAX_TWICE:  # lse = max + log Σ exp(x); the NaN form is the solution's rounding correction of lse
            with np.errstate(all="ignore"):
                log_sum = np.log(_exp(x, work).sum(axis=-1, keepdims=True))
            twice = _ratio(_exp(x - top - log_sum, work), 1.0)
            out[bug] = [twice, np.where(np.isfinite(log_sum), twice, np.nan)]
        elif bug == UNNORMALISED:
            out[bug] = np.asarray(e, dtype=np.float64)
        elif bug == WHOLE_SUM:
            out[bug] = _ratio(e, e.sum())
        elif bug == GLOBAL_MAX:
            out[bug] = _softmax_by(x, x.max(), work)
        elif bug in (COLUMN_SUM, COLUMN_MAX) and x.ndim >= 2 and x.shape[0] > 1:
            axes = sorted({0, x.ndim - 2})
            out[bug] = ([_ratio(e, e.sum(axis=a, keepdims=True)) for a in axes] if bug == COLUMN_SUM else
                        [_softmax_by(x, x.max(axis=a, keepdims=True), work) for a in axes])
        elif bug == ZERO_PAD:
            out[bug] = [_zero_padded(x, w, work) for w in widths]
        elif bug == UNMASKED:
            out[bug] = [u for w in widths for u in _unmasked(x, got, w)]
        elif bug == LSE_ROUNDED and work == np.float32:
            with np.errstate(all="ignore"):
                lse = (top.astype(np.float32) + np.log(e.sum(axis=-1, keepdims=True))).astype(np.float32)
            out[bug] = np.asarray(_exp(x - lse, np.float32), dtype=np.float64)
        elif bug == FP16_SUM and dtype == "float16":
            forms = []
            for total in _fp16_sums(e):
                y = _ratio(e, total)
                forms += [y, np.where(np.isinf(total), np.nan, y)]  # 1 / inf, or inf - inf in an lse
            out[bug] = forms
    return out


NUMPY_BUGS = (NO_MAX, MAX_TWICE, UNNORMALISED, WHOLE_SUM, COLUMN_SUM, COLUMN_MAX, GLOBAL_MAX, LSE_ROUNDED)
KERNEL_BUGS = (NO_MAX, MAX_TWICE, UNNORMALISED, ZERO_PAD, UNMASKED, LSE_ROUNDED, FP16_SUM)  # one program per row


def numpy_variants(x, dtype, got):
    return softmax_variants(x, dtype, got, NUMPY_BUGS)


def kernel_variants(x, dtype, got):
    return softmax_variants(x, dtype, got, KERNEL_BUGS)


# ---------------------------------------------------------------- known wrong log-softmaxes
LOG_NO_MAX = ("inf where the answer is finite: exp(x) overflowed (or its sum underflowed to 0) before the log. "
              "Subtract each row's max first: y = x - max - log Σ exp(x - max).")
LOG_OF_SOFTMAX = ("-inf where the answer is finite: log(softmax) underflows when exp(x - max) is 0 in float32. "
                  "Never take the exp of the output: y = x - max - log Σ exp(x - max).")
LOG_NO_LSE = "each row is off by a constant: subtract log Σ exp(x - max) as well (y = x - max - log Σ exp(x - max))."
LOG_NO_LOG = ("each row is off by a constant: the sum Σ exp(x - max) was subtracted without its log "
              "(y = x - max - log Σ exp(x - max)).")
LOG_MAX_TWICE = ("each row is off by the row's max: it is counted twice. log Σ exp(x) already contains it; "
                 "use y = x - max - log Σ exp(x - max).")


def log_softmax_variants(x, dtype: str, got) -> dict:
    work = _work(dtype)
    top = x.max(axis=-1, keepdims=True)
    e = _exp(x - top, work)
    with np.errstate(all="ignore"):
        total = e.sum(axis=-1, keepdims=True)
        out = {LOG_NO_MAX: np.asarray(x - np.log(_exp(x, work).sum(axis=-1, keepdims=True)), dtype=np.float64),
               LOG_OF_SOFTMAX: np.asarray(np.log(e / total), dtype=np.float64),
               LOG_NO_LSE: x - top,
               LOG_NO_LOG: np.asarray(x - top - total, dtype=np.float64),
               LOG_MAX_TWICE: np.asarray(x - top - np.log(_exp(x, work).sum(axis=-1, keepdims=True)),
                                         dtype=np.float64)}
        widths = _pad_widths(x.shape[-1])
        out[ZERO_PAD] = [_zero_padded(x, w, work, log=True) for w in widths]
        out[UNMASKED] = [u for w in widths for u in _unmasked(x, got, w, log=True)]
        if dtype == "float16":
            out[FP16_SUM] = [np.asarray(x - top - np.log(s), dtype=np.float64) for s in _fp16_sums(e)]
    return out


# ---------------------------------------------------------------- the looped Triton kernel (online_softmax)
NO_RESCALE = ("the running sum is not rescaled when the max grows: multiply l by exp(m - m_new) before adding the "
              "new block's terms exp(x - m_new).")
STALE_SHIFT = ("the new terms are shifted by the old max: exp(x - m) overflows while m is still its starting value "
               "(-1e38 or -inf), which zeroes every probability. Shift them by m_new = max(m, the block's max).")
ZERO_START = ("rows whose logits are all negative go wrong: the running max starts at 0, so exp(x - 0) underflows "
              "and the sum is 0 (1 / 0). Start it at -1e38 (or -inf, with a guard).")
FROZEN = "the running max is never updated: after each block, m must become m_new."
NEG_INF_START = ("NaN: the running max starts at -inf, so lanes that have seen only -inf (the padding past the row's "
                 "end, masked logits) compute exp(-inf - (-inf)) = NaN. Start it at -1e38, or use 0 as the shift "
                 "where m_new is -inf.")


def _online_softmax(x, block: int, group: int, bug: str | None = None, start: float = -1e38):
    """online_softmax_kernel in float32 NumPy: `block` columns per step, one running (m, l) for each `group` of
    neighbouring columns of a block (8 in the solution, 1 per lane, or `block` for one per row), with `bug`."""
    n = x.shape[-1]
    rows = x.reshape(-1, n).astype(np.float32)
    steps = -(-n // block)
    padded = np.full((len(rows), steps * block), -np.inf, np.float32)
    padded[:, :n] = rows
    tiles = padded.reshape(len(rows), steps, block // group, group)
    m = np.full((len(rows), block // group), 0.0 if bug == ZERO_START else start, np.float32)
    l = np.zeros_like(m)
    with np.errstate(all="ignore"):
        for step in range(steps):
            t = tiles[:, step]
            m_new = np.maximum(m, t.max(axis=-1))
            terms = np.exp(t - (m if bug == STALE_SHIFT else m_new)[..., None]).sum(axis=-1)
            l = (l if bug == NO_RESCALE else l * np.exp(m - m_new)) + terms
            m = m if bug == FROZEN else m_new
        m_row = m.max(axis=-1, keepdims=True)
        inv = np.float32(1) / (l * np.exp(m - m_row)).sum(axis=-1, keepdims=True)
        return (np.exp(rows - m_row) * inv).reshape(x.shape).astype(np.float64)


def online_variants(x, dtype: str, got) -> dict:
    block = min(max(16, _next_pow2(x.shape[-1])), 8192)
    shapes = [(block, 8), (block, 1), (block, block)]
    out = {bug: [_online_softmax(x, b, g, bug) for b, g in shapes]
           for bug in (NO_RESCALE, STALE_SHIFT, ZERO_START, FROZEN)}
    out[NEG_INF_START] = [_online_softmax(x, b, g, None, -np.inf) for b, g in shapes]
    return {**out, **softmax_variants(x, dtype, got, (ZERO_PAD, UNMASKED, FP16_SUM))}


# ---------------------------------------------------------------- CUDA C: the block-wide tree (block_softmax)
TREE_FROM_QUARTER = ("the reduction drops half the threads: the tree must start at stride THREADS / 2, so that "
                     "threads THREADS/2 … THREADS-1 are folded in.")
TREE_STOPS_EARLY = ("the reduction stops one step early: the loop must run down to stride 1 (stride > 0), or "
                    "the odd threads' values are never combined.")
TREE_OWN_PARTIAL = ("each thread kept its own partial result: after the tree, the block's result is smem[0], for "
                    "every thread (read it, then __syncthreads() before smem is reused).")
BLOCK_THREADS = 256


def _tree(v, op, bug):
    """block_reduce of block_softmax: a shared-memory tree over the threads' values v (rows, THREADS)."""
    smem = v.copy()
    stride = BLOCK_THREADS // (4 if bug == TREE_FROM_QUARTER else 2)
    while stride >= (2 if bug == TREE_STOPS_EARLY else 1):
        smem[:, :stride] = op(smem[:, :stride], smem[:, stride:2 * stride])
        stride //= 2
    return smem if bug == TREE_OWN_PARTIAL else np.repeat(smem[:, :1], BLOCK_THREADS, axis=1)


def _per_thread(rows, owner, threads, op, start):
    """Each thread's own reduction (fmaxf or +) of the columns it owns: (rows, threads)."""
    acc = np.full((threads, len(rows)), start, np.float32)
    op.at(acc, owner, rows.T)
    return acc.T


def _block_softmax(x, bug):
    n = x.shape[-1]
    rows = x.reshape(-1, n).astype(np.float32)
    owner = np.arange(n) % BLOCK_THREADS
    with np.errstate(all="ignore"):
        m = _tree(_per_thread(rows, owner, BLOCK_THREADS, np.fmax, -np.inf), np.fmax, bug)
        e = np.exp(rows - m[:, owner])
        inv = np.float32(1) / _tree(_per_thread(e, owner, BLOCK_THREADS, np.add, 0.0), np.add, bug)
        return (e * inv[:, owner]).reshape(x.shape).astype(np.float64)


def block_variants(x, dtype: str, got) -> dict:
    """The learner writes block_reduce only: its known bugs."""
    return {bug: _block_softmax(x, bug) for bug in (TREE_FROM_QUARTER, TREE_STOPS_EARLY, TREE_OWN_PARTIAL)}


# ---------------------------------------------------------------- CUDA C: warp shuffles (warp_softmax)
WARP_MAX_FROM_8 = ("the max butterfly starts at offset 8: lanes 0-15 never see lanes 16-31. Start at offset 16 "
                   "(half the warp) and halve down to 1.")
WARP_SUM_IS_MAX = ("the sum reduction combines with fmaxf: warp_reduce_sum must add (v += __shfl_xor_sync(...)), "
                   "not take the max.")
WARP_SUM_STOPS = ("the sum butterfly stops before offset 1: neighbouring lanes are never added. Loop while "
                  "offset > 0.")
CHUNKS = 4


def _butterfly(v, is_max, bug):
    """A warp's __shfl_xor_sync reduction, every lane's result: v (..., 32)."""
    offsets = [16, 8, 4, 2, 1]
    if is_max and bug == WARP_MAX_FROM_8:
        offsets = offsets[1:]
    if not is_max and bug == WARP_SUM_STOPS:
        offsets = offsets[:-1]
    lanes = np.arange(32)
    for offset in offsets:
        v = np.fmax(v, v[..., lanes ^ offset]) if is_max or bug == WARP_SUM_IS_MAX else v + v[..., lanes ^ offset]
    return v


def _warp_block_reduce(v, is_max, bug):
    """block_reduce of warp_softmax: each warp reduces, lane 0 parks its result in smem[warp], then every warp
    reduces smem (identity past the warp count) and thread t takes lane t % 32's result."""
    warps = v.shape[1] // 32
    first = _butterfly(v.reshape(len(v), warps, 32), is_max, bug)[..., 0]
    lanes = np.full((len(v), 32), -np.inf if is_max else 0.0, np.float32)
    lanes[:, :warps] = first
    return np.tile(_butterfly(lanes, is_max, bug), warps)


def _warp_softmax(x, dtype, bug):
    """warp_softmax in float32 NumPy, thread by thread: 16-byte packs in registers (a row that fits) or a
    per-thread online softmax over a strided row."""
    n = x.shape[-1]
    rows = x.reshape(-1, n).astype(np.float32)
    vec = 16 // ITEMSIZE[dtype]
    packs = -(-n // vec)
    threads = min(1024, max(32, _next_pow2(-(-packs // CHUNKS))))
    in_registers = packs <= CHUNKS * threads
    owner = (np.arange(n) // vec) % threads if in_registers else np.arange(n) % threads
    with np.errstate(all="ignore"):
        own_max = _per_thread(rows, owner, threads, np.fmax, -np.inf)
        m = _warp_block_reduce(own_max, True, bug)
        if in_registers:
            e = np.exp(rows - m[:, owner])
            padding = CHUNKS * vec - np.bincount(owner, minlength=threads)  # lanes holding -inf
            s = _per_thread(e, owner, threads, np.add, 0.0) + np.where(padding > 0, np.exp(-np.inf - m), 0.0)
        else:
            e = np.exp(rows - m[:, owner])
            own = np.where(np.isneginf(own_max), 0.0, _per_thread(np.exp(rows - own_max[:, owner]), owner, threads,
                                                                  np.add, 0.0) * np.exp(own_max - m))
            s = own.astype(np.float32)
        inv = np.float32(1) / _warp_block_reduce(s.astype(np.float32), False, bug)
        return (e * inv[:, owner]).reshape(x.shape).astype(np.float64)


def warp_variants(x, dtype: str, got) -> dict:
    """The learner writes the two warp reductions only: their known bugs."""
    return {bug: _warp_softmax(x, dtype, bug) for bug in (WARP_MAX_FROM_8, WARP_SUM_IS_MAX, WARP_SUM_STOPS)}


# ---------------------------------------------------------------- row hints
NON_FINITE = ("NaN or inf where the answer is finite: look for an exp of a large number, a 0 / 0 or a log of 0 "
              "in your code.")


def row_hint(variants):
    """A hint for a row-softmax task whose known bugs `variants(x, dtype, got)` computes."""
    def hint(case, got, expected):
        (x,) = seen(case)
        found = matches(got, expected, variants(x, case.dtype, got))
        if not found and (~np.isfinite(got) & np.isfinite(expected)).any():
            return NON_FINITE  # no known bug, but what is wrong is plain to see
        return OR.join(found[:3]) or None  # bugs this case cannot tell apart share its vote (grading._diagnosis)
    return hint


# ---------------------------------------------------------------- the running state (m, l)
STATE_MAX = "the new max must be the larger of the running max and the new values' max (np.maximum of the two)."
STATE_MIN = "the merged max is the larger of the two maxima (np.maximum), not the smaller."
STATE_NO_RESCALE = ("the old sum is not rescaled: when the max grows from m to m_new, multiply l by exp(m - m_new) "
                    "before adding.")
STATE_LEFT = "the left state's sum is not rescaled: multiply l_a by exp(m_a - m) as you do l_b by exp(m_b - m)."
STATE_RIGHT = "the right state's sum is not rescaled: multiply l_b by exp(m_b - m) as you do l_a by exp(m_a - m)."
STATE_NO_GUARD = ("NaN for an empty row: where the new max is -inf, exp(m - m_new) is exp(-inf - (-inf)) = NaN. "
                  "Shift by 0 where the new max is -inf.")
STATE_NOT_SHIFTED = ("the new terms are not shifted: add Σ exp(chunk - m_new), not Σ exp(chunk), which overflows "
                     "on large logits.")
STATE_STALE = "the new terms are shifted by the old max: add Σ exp(chunk - m_new), with the new max."
STATE_INVERTED = ("the rescale factor is inverted: an old sum shrinks by exp(m_old - m_new) (at most 1) when the "
                  "max grows, it does not grow by exp(m_new - m_old).")
STATE_DROPPED = "the old sum is dropped: l_new = l · exp(m - m_new) + Σ exp(chunk - m_new)."


def _shift(m):
    return np.where(np.isneginf(m), 0.0, m)


def update_variants(m, l, chunk, work) -> dict:
    """output -> hint -> what a known bug of online_softmax_update makes of it."""
    top = chunk.max(axis=-1)
    m_new = np.maximum(m, top)
    shift = _shift(m_new)

    def terms(by):
        return _exp(chunk - by[:, None], work).sum(axis=-1)

    with np.errstate(all="ignore"):
        right = terms(shift)
        return {"m": {STATE_MAX: [top, m], STATE_MIN: np.minimum(m, top)},
                "l": {STATE_NO_RESCALE: l + right,
                      STATE_NO_GUARD: l * _exp(m - m_new, work) + terms(m_new),
                      STATE_NOT_SHIFTED: l * _exp(m - shift, work) + _exp(chunk, work).sum(axis=-1),
                      STATE_STALE: l * _exp(m - shift, work) + terms(m),
                      STATE_INVERTED: l * _exp(shift - m, work) + right,
                      STATE_DROPPED: right}}


def merge_variants(m_a, l_a, m_b, l_b, work) -> dict:
    m = np.maximum(m_a, m_b)
    shift = _shift(m)
    with np.errstate(all="ignore"):
        a, b = l_a * _exp(m_a - shift, work), l_b * _exp(m_b - shift, work)
        return {"m": {STATE_MIN: np.minimum(m_a, m_b), STATE_MAX: [m_a, m_b]},
                "l": {STATE_LEFT: l_a + b, STATE_RIGHT: a + l_b, STATE_NO_RESCALE: l_a + l_b,
                      STATE_NO_GUARD: l_a * _exp(m_a - m, work) + l_b * _exp(m_b - m, work),
                      STATE_INVERTED: l_a * _exp(shift - m_a, work) + l_b * _exp(shift - m_b, work)}}


def state_hint(variants):
    def hint(case, got, expected):
        found = matches(got, expected, variants(*seen(case), _work(case.dtype))[case.output])
        if len(found) != 1 and np.isnan(got).any() and not np.isnan(expected).any():
            return STATE_NO_GUARD  # several bugs NaN an empty row: the guard is what keeps ±inf out of its exps
        return OR.join(found[:3]) or None  # bugs this case cannot tell apart share its vote (grading._diagnosis)
    return hint


def _softmax_task(name, backend, regions, dtypes, variants, reference=ref.softmax):
    return Task(f"w33.{name}", backend, regions, row_cases, lambda x: (reference(x),), writes_out=backend != "numpy",
                banned=BANNED, hint=row_hint(variants), dtypes=dtypes)


TASKS = {t.id: t for t in [
    _softmax_task("stable_softmax", "numpy", ("stable_softmax",), ("float64", "float32"), numpy_variants),
    _softmax_task("block_softmax", "cuda", ("BLOCK_SOFTMAX_SRC",), ALL_DTYPES, block_variants),
    _softmax_task("warp_softmax", "cuda", ("WARP_SOFTMAX_SRC",), ALL_DTYPES, warp_variants),
    _softmax_task("triton_softmax", "triton", ("softmax_kernel",), ALL_DTYPES, kernel_variants),
    Task("w33.online_softmax_update", "numpy", ("online_softmax_update",), update_cases,
         lambda m, l, x: ref.merge_states(m, l, *ref.softmax_state(x)), outputs=("m", "l"), banned=BANNED,
         hint=state_hint(update_variants), dtypes=("float64", "float32")),
    Task("w33.merge_softmax_states", "numpy", ("merge_softmax_states",), merge_cases,
         ref.merge_states, outputs=("m", "l"), banned=BANNED, hint=state_hint(merge_variants),
         dtypes=("float64", "float32")),
    _softmax_task("online_softmax", "triton", ("online_softmax_kernel",), ALL_DTYPES, online_variants),
    _softmax_task("log_softmax", "triton", ("log_softmax_kernel",), ALL_DTYPES, log_softmax_variants,
                  reference=ref.log_softmax),
]}
