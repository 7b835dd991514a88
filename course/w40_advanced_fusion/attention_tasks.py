"""Graded tasks of week 40, days 3-4: the chunk recurrence and the causal chunked kernel of linear attention, and the
tile lists of block-sparse attention. A failure is diagnosed by computing, on the case's own inputs, what each known
slip would have produced (grading.diagnose)."""
import numpy as np

from ..grading import Case, Task, diagnose, exact, pick, seen
from . import reference as ref

CHUNKS = (16, 32, 64, 128)  # the chunk sizes a kernel may use (solutions' LINEAR_TILES): slips are tried at each

# ---------------------------------------------------------------- day 3: chunk_recurrence (NumPy)
INCLUSIVE = ("the state of chunk c already holds chunk c: store S_c and z_c BEFORE adding the chunk's keys (S_0 = 0), "
             "the chunk's own keys enter through the masked quadratic part")
NOT_RUNNING = "S_c sums every chunk before c, not only the previous one: keep a running total and add each chunk to it"
BOUNDARY = "chunk c covers positions c·chunk … c·chunk + chunk − 1 (slice [c·chunk : (c + 1)·chunk]): a boundary is off"
NO_NORM = "the normaliser z_c = Σ φ(k_j) over the earlier positions is missing (or not accumulated)"
TRANSPOSED = "the state is Σ φ(k_j) v_jᵀ, a (d, dv) matrix: φ(k)ᵀ v, not vᵀ φ(k)"


def _recurrence(phi_k, v, chunk, lo=0, hi=None, inclusive=False, running=True):
    """(states, norms) with the slips: chunk slices [c·chunk + lo, (c + 1)·chunk + hi), the chunk's own keys counted
    (inclusive), or only the previous chunk (running=False)."""
    n = phi_k.shape[-2]
    hi = lo if hi is None else hi
    n_chunks = -(-n // chunk)
    states, norms = [], []
    state, norm = np.zeros(phi_k.shape[:-2] + (phi_k.shape[-1], v.shape[-1])), np.zeros(phi_k.shape[:-2] + phi_k.shape[-1:])
    for c in range(n_chunks):
        start, stop = max(c * chunk + lo, 0), max((c + 1) * chunk + hi, 0)
        add_s = np.swapaxes(phi_k[..., start:stop, :], -1, -2) @ v[..., start:stop, :]
        add_z = phi_k[..., start:stop, :].sum(axis=-2)
        if inclusive:
            state, norm = (state if running else 0) + add_s, (norm if running else 0) + add_z
        states.append(state)
        norms.append(norm)
        if not inclusive:
            state, norm = (state if running else 0) + add_s, (norm if running else 0) + add_z
    return np.stack(states, axis=-3), np.stack(norms, axis=-2)


def recurrence_variants(phi_k, v, chunk):
    """hint -> [(states, norms)] of chunk_recurrence's known slips on the case's inputs."""
    right = ref.chunk_recurrence(phi_k, v, chunk)
    out = {INCLUSIVE: [_recurrence(phi_k, v, chunk, inclusive=True)],
           NOT_RUNNING: [_recurrence(phi_k, v, chunk, running=False), _recurrence(phi_k, v, chunk, True, running=False)],
           BOUNDARY: [_recurrence(phi_k, v, chunk, lo, hi) for lo, hi in ((1, 1), (-1, -1), (0, 1), (0, -1), (1, 0))],
           NO_NORM: [(None, np.zeros_like(right[1]))]}
    if phi_k.shape[-1] == v.shape[-1]:
        out[TRANSPOSED] = [(np.swapaxes(right[0], -1, -2), None)]
    return out


def recurrence_hint(case, got, expected):
    return diagnose(got, expected, pick(recurrence_variants(*seen(case), **case.kwargs),
                                        ("states", "norms").index(case.output)))


def recurrence_cases(rng, dtypes):
    """Keys after elu + 1 (positive, as φ makes them), values normal; sizes with a short last chunk, one chunk, a
    chunk of 1, N below the chunk, leading dims."""
    shapes = [((1, 4), 4, 1), ((10, 3), 5, 4), ((16, 8), 8, 16), ((33, 5), 7, 8), ((2, 3, 50, 6), 4, 7),
              ((5, 4), 4, 8), ((int(rng.integers(20, 90)), int(rng.integers(1, 9))), int(rng.integers(1, 9)),
                                int(rng.integers(2, 20)))]
    cases = []
    for lead, dv, chunk in shapes:
        phi_k = ref.feature_map(rng.normal(0, 1, lead))
        v = rng.normal(0, 1, lead[:-1] + (dv,))
        cases.append(Case(f"φ(k) {tuple(phi_k.shape)}, v {tuple(v.shape)}, chunks of {chunk}", (phi_k, v), "float64",
                          kwargs={"chunk": chunk}))
    return cases


# ---------------------------------------------------------------- day 3: causal_linear_attention (Triton)
STRICT = ("the diagonal is masked out: query i sees key j <= i (itself included), so keep a[i, j] where "
          "position j <= position i")
NO_MASK = "the chunk's later keys leak in: mask the (chunk × chunk) weights to j <= i before using them"
NO_STATE = ("the earlier chunks are missing: add φ(q)·S_c to the numerator and φ(q)·z_c to the normaliser (the state "
            "carries every chunk before this one)")
STATE_NUM_ONLY = "the normaliser leaves out the earlier chunks: den = rowsum(a) + φ(q)·z_c + eps"
STATE_DEN_ONLY = "the numerator leaves out the earlier chunks: num = a·v + φ(q)·S_c"
NO_NORMALISER = "the outputs are not normalised: divide by rowsum(a) + φ(q)·z_c + eps"
INTRA_NOT_IN_DEN = "the normaliser leaves out the chunk's own weights: den = rowsum(masked a) + φ(q)·z_c + eps"
FEATURE_AFTER = ("the feature map acts on q and k before their product: a = φ(q)·φ(k)ᵀ, not φ(q·kᵀ) (a sum of "
                 "positive features stays positive; φ of the product does not factor through a state)")
PADDED = ("a padded key or dimension counted: elu(0) + 1 = 1, so positions past N and dimensions past d must give "
          "φ = 0 (load with a mask and zero φ there)")


def _chunked(q, k, v, chunk, feature, strict=False, mask=True, state=True, den_state=True, normalise=True,
             den_intra=True, after=False, pad_dims=0, num_state=True):
    """Causal linear attention by chunks with the slips above switched on."""
    phi_q, phi_k = ref.feature_map(q, feature), ref.feature_map(k, feature)
    if pad_dims:
        phi_q, phi_k = (np.concatenate([p, np.ones(p.shape[:-1] + (pad_dims,))], axis=-1) for p in (phi_q, phi_k))
    states, norms = ref.chunk_recurrence(phi_k, v, chunk)
    out = np.zeros(q.shape[:-1] + v.shape[-1:])
    for c, s in enumerate(range(0, q.shape[-2], chunk)):
        pq, pk, pv = phi_q[..., s:s + chunk, :], phi_k[..., s:s + chunk, :], v[..., s:s + chunk, :]
        a = ref.feature_map(q[..., s:s + chunk, :] @ np.swapaxes(k[..., s:s + chunk, :], -1, -2), feature) \
            if after else pq @ np.swapaxes(pk, -1, -2)
        if mask:
            a = np.tril(a, -1 if strict else 0)
        num = a @ pv + (pq @ states[..., c, :, :] if state and num_state else 0)
        den = (a.sum(axis=-1) if den_intra else 0) + ((pq * norms[..., c, None, :]).sum(axis=-1) if den_state
                                                      else 0) + ref.LINEAR_EPS
        out[..., s:s + chunk, :] = num / den[..., None] if normalise else num
    return out


def linear_variants(q, k, v, feature="elu1"):
    """hint -> [o] of causal_linear_attention's known slips on the case's inputs, at every chunk size a kernel may
    use."""
    slips = {STRICT: {"strict": True}, NO_MASK: {"mask": False}, NO_STATE: {"state": False, "den_state": False},
             STATE_NUM_ONLY: {"den_state": False}, STATE_DEN_ONLY: {"num_state": False}, NO_NORMALISER: {"normalise": False},
             INTRA_NOT_IN_DEN: {"den_intra": False}, FEATURE_AFTER: {"after": True}}
    with np.errstate(all="ignore"):
        out = {hint: [_chunked(q, k, v, chunk, feature, **slip) for chunk in CHUNKS] for hint, slip in slips.items()}
        block = max(16, 1 << (q.shape[-1] - 1).bit_length())
        if feature == "elu1" and block > q.shape[-1]:
            out[PADDED] = [_chunked(q, k, v, chunk, feature, pad_dims=block - q.shape[-1]) for chunk in CHUNKS]
    return out


def linear_hint(case, got, expected):
    return diagnose(got, expected, linear_variants(*seen(case), **case.kwargs))


def rounding_rule(q, k, v, feature, dtype):
    """16 bits: the tolerance of FlashAttention's test rule applied to the chunked form as a kernel computes it: φ(q),
    φ(k), the masked weights and the states rounded to the dtype (float32 sums), at every chunk size a kernel may use:
    twice its largest error, plus one rounding of the largest output. float32: None (the dtype's own tolerance)."""
    if dtype == "float32":
        return None
    import torch
    unit = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[dtype]
    rnd = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float64)).to(getattr(torch, dtype)).double().numpy()  # noqa
    q, k, v = rnd(q), rnd(k), rnd(v)
    exact_o = ref.linear_attention(q, k, v, feature)[0]
    phi_q, phi_k = rnd(ref.feature_map(q, feature)), rnd(ref.feature_map(k, feature))
    worst = 0.0
    for chunk in CHUNKS:
        states, norms = ref.chunk_recurrence(phi_k, v, chunk)
        for c, s in enumerate(range(0, q.shape[-2], chunk)):
            pq, pk, pv = phi_q[..., s:s + chunk, :], phi_k[..., s:s + chunk, :], v[..., s:s + chunk, :]
            a = np.tril(pq @ np.swapaxes(pk, -1, -2))
            num = rnd(a) @ pv + pq @ rnd(states[..., c, :, :])
            den = a.sum(axis=-1) + (pq * norms[..., c, None, :]).sum(axis=-1) + ref.LINEAR_EPS
            worst = max(worst, float(np.abs(num / den[..., None] - exact_o[..., s:s + chunk, :]).max()))
    floor = unit * float(np.abs(exact_o).max()) + 1e-5
    return (2 * worst + floor, 0.0, f"FlashAttention's rule on the chunked form rounded to {dtype} (φ, the weights, "
            f"the states): 2 × its error ({worst:.2g}) + one rounding of the largest output ({floor:.2g})")


LINEAR_SHAPES = (("N = 1", 1, 1, 1, 16, 16), ("(2, 3) heads, N = 37, d = 32", 2, 3, 37, 32, 32),
                 ("N = 100: several chunks, the last one short; d = 48, dv = 24 (no power of two)", 1, 2, 100, 48, 24),
                 ("N = 64, d = 16, dv = 64", 1, 1, 64, 16, 64), ("N = 200, d = 64", 1, 1, 200, 64, 64))


def linear_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for i, (name, b, h, n, d, dv) in enumerate(LINEAR_SHAPES):
            feature = ("elu1", "relu")[i % 2]
            q, k, v = rng.normal(0, 1, (b, h, n, d)), rng.normal(0, 1, (b, h, n, d)), rng.normal(0, 1, (b, h, n, dv))
            cases.append(Case(f"{name}, φ = {feature}", (q, k, v), dtype, rounding_rule(q, k, v, feature, dtype),
                              kwargs={"feature": feature}))
        q = rng.normal(0, 1, (1, 1, 40, 32))
        q[..., :5, :] = -np.abs(q[..., :5, :])  # the first queries' ReLU features are all 0: o = 0, not 0 / 0
        k, v = -np.abs(rng.normal(0, 1, (1, 1, 40, 32))), rng.normal(0, 1, (1, 1, 40, 32))
        k[..., 20:, :] = np.abs(k[..., 20:, :])
        cases.append(Case("φ = relu with rows of all-zero features", (q, k, v), dtype,
                          rounding_rule(q, k, v, "relu", dtype), kwargs={"feature": "relu"}))
        q, k = rng.normal(0, 3, (1, 2, 70, 32)), rng.normal(0, 3, (1, 2, 70, 32))
        v = rng.normal(0, 1, (1, 2, 70, 32))
        cases.append(Case("large |q|, |k| (scale 3): elu + 1 spans exp(−9) … 10", (q, k, v), dtype,
                          rounding_rule(q, k, v, "elu1", dtype), kwargs={"feature": "elu1"}))
    return cases


LINEAR_DTYPES = ("float32", "float16", "bfloat16")
LINEAR_BANNED = ("torch.matmul", "torch.bmm", "torch.einsum", "torch.Tensor.matmul", "torch.cumsum",
                 "torch.nn.functional.elu")

# ---------------------------------------------------------------- day 4: block_tile_list (NumPy)
ANY_AS_FULL = ("full tiles go in the full list, not the partial one: a tile whose every pair is kept needs no mask "
               "(that is the work the split saves)")
PARTIAL_DROPPED = ("tiles with only some pairs kept are missing: a tile with at least one kept pair must be visited "
                   "(partial list), or those queries lose keys")
EDGE_FULL = ("a tile that runs past M or N is listed as full: the pairs past the edge do not exist, so the kernel "
             "must mask that tile (count the padding as masked)")
ORDER = "list each row's tiles in ascending order (the kernel walks keys left to right), then −1"
EMPTY_LISTED = "a tile with no kept pair is listed: skipping such tiles is the whole point"


def _lists(keep, block_m, block_n, partial_rule, full_rule, descending=False, pad_kept=False):
    m, n = keep.shape
    tm, tn = -(-m // block_m), -(-n // block_n)
    padded = np.zeros((tm * block_m, tn * block_n), dtype=bool) if not pad_kept else \
        np.ones((tm * block_m, tn * block_n), dtype=bool)
    padded[:m, :n] = keep
    kept = padded.reshape(tm, block_m, tn, block_n).sum(axis=(1, 3))
    out = []
    for listed in partial_rule(kept, block_m * block_n), full_rule(kept, block_m * block_n):
        index = np.full((tm, tn), -1)
        for r in range(tm):
            tiles = np.flatnonzero(listed[r])[::-1] if descending else np.flatnonzero(listed[r])
            index[r, :len(tiles)] = tiles
        out += [listed.sum(axis=1), index]
    return tuple(np.asarray(x, dtype=np.float64) for x in out)


def tile_list_variants(keep, block_m, block_n):
    """hint -> [(partial_count, partial_index, full_count, full_index)] of the known slips."""
    partial = lambda k, t: (k > 0) & (k < t)  # noqa: E731
    full = lambda k, t: k == t  # noqa: E731
    none = lambda k, t: np.zeros_like(k, dtype=bool)  # noqa: E731
    return {ANY_AS_FULL: [_lists(keep, block_m, block_n, lambda k, t: k > 0, none)],
            PARTIAL_DROPPED: [_lists(keep, block_m, block_n, none, full), _lists(keep, block_m, block_n, full, none)],
            EDGE_FULL: [_lists(keep, block_m, block_n, partial, full, pad_kept=True)],
            ORDER: [_lists(keep, block_m, block_n, partial, full, descending=True)],
            EMPTY_LISTED: [_lists(keep, block_m, block_n, lambda k, t: k < t, full)]}


def tile_list_hint(case, got, expected):
    variants = tile_list_variants(**case.kwargs)
    outputs = ("partial_count", "partial_index", "full_count", "full_index")
    return diagnose(got, expected, pick(variants, outputs.index(case.output)), rtol=1e-9)


def tile_list_cases(rng, dtypes):
    """The lessons' masks (causal, sliding window, documents, both) at sizes that do and do not divide the tiles,
    M != N, a random mask, nothing kept, everything kept, a single pair."""
    docs = np.repeat(np.arange(4), [13, 40, 7, 40])
    m = int(rng.integers(40, 130))
    masks = [("causal, N = 64, tiles 16 × 16", ref.token_mask(64, 64), 16, 16),
             ("causal, N = 100, tiles 32 × 16: the last tiles run past the edge", ref.token_mask(100, 100), 32, 16),
             ("sliding window 24, causal, N = 96, tiles 16 × 32", ref.token_mask(96, 96, window=24), 16, 32),
             ("sliding window 10 both ways, N = 70", ref.token_mask(70, 70, causal=False, window=10), 16, 16),
             ("documents of 13, 40, 7, 40 tokens, causal", ref.token_mask(100, 100, documents=docs), 16, 16),
             ("documents, no causal mask, tiles 32 × 32", ref.token_mask(100, 100, False, documents=docs), 32, 32),
             (f"random mask ({m}, 50), 30 % kept", rng.random((m, 50)) < 0.3, 16, 16),
             ("M = 40 queries, N = 90 keys, causal", ref.token_mask(40, 90), 16, 32),
             ("nothing kept (48, 48)", np.zeros((48, 48), dtype=bool), 16, 16),
             ("everything kept (50, 33)", np.ones((50, 33), dtype=bool), 16, 16),
             ("a single query and key", np.ones((1, 1), dtype=bool), 16, 16)]
    return [Case(name, (), "float64", kwargs={"keep": keep, "block_m": bm, "block_n": bn})
            for name, keep, bm, bn in masks]


ATTENTION_TASKS = [
    Task("w40.chunk_recurrence", "numpy", ("chunk_recurrence",), recurrence_cases, ref.chunk_recurrence,
         outputs=("states", "norms"), hint=recurrence_hint, dtypes=("float64",)),
    Task("w40.causal_linear_attention", "triton", ("linear_output_kernel",), linear_cases, ref.linear_attention,
         outputs=("o",), banned=LINEAR_BANNED, hint=linear_hint, dtypes=LINEAR_DTYPES),
    Task("w40.block_tile_list", "numpy", ("block_tile_list",), tile_list_cases, exact(ref.tile_lists),
         outputs=("partial_count", "partial_index", "full_count", "full_index"), hint=tile_list_hint,
         dtypes=("float64",)),
]
