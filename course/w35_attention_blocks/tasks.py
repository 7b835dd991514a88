"""Graded tasks of week 35: the cases each exercise is swept over, and hints keyed to its pitfalls.

Adversarial cases of every attention exercise: N = 1, lengths that are no multiple of a block,
d in {16, 64, 128}, fully masked rows, logits of ±1e4 and non-contiguous (B, N, H, d) storage.
"""
import numpy as np

from .. import backend
from ..grading import Case, Task
from . import reference as ref

SOFTMAXES = tuple(f"{m}.{f}" for m in ("torch", "torch.nn.functional", "torch.Tensor", "torch.special")
                  for f in ("softmax", "log_softmax")) + ("scipy.special.softmax",)
SDPA = ("torch.nn.functional.scaled_dot_product_attention", "torch.nn.functional.multi_head_attention_forward")
MATMULS = ("torch.matmul", "torch.bmm", "torch.einsum", "torch.Tensor.__matmul__", "torch.Tensor.matmul",
           "torch.Tensor.bmm", "torch.baddbmm")
ALL_DTYPES = ("float32", "float16", "bfloat16")
HUGE = 1e4
UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}

# (name, B, H, M, N, d): the head shapes every kernel exercise sweeps.
SHAPES = [
    ("N = 1", 1, 1, 1, 1, 16),
    ("odd lengths (2, 3, 37, 64): not a multiple of any block", 2, 3, 37, 37, 64),
    ("M = 45 queries, N = 70 keys, d = 16", 1, 2, 45, 70, 16),
    ("d = 128, N = 33", 1, 2, 33, 33, 128),
    ("a full block (1, 1, 64, 64, d = 64)", 1, 1, 64, 64, 64),
]
# (name, kwargs builder (B, H, M, N, rng) -> dict): the masks every softmax/attention exercise sweeps.
MASKS = [
    ("no mask", lambda b, h, m, n, rng: {}),
    ("causal", lambda b, h, m, n, rng: {"causal": True}),
    ("key padding", lambda b, h, m, n, rng: {"key_lengths": rng.integers(1, n + 1, b)}),
    ("ALiBi", lambda b, h, m, n, rng: {"alibi_slopes": ref.alibi_slopes(h)}),
    ("causal + padding + ALiBi", lambda b, h, m, n, rng: {"causal": True, "key_lengths": rng.integers(1, n + 1, b),
                                                          "alibi_slopes": ref.alibi_slopes(h)}),
    ("fully masked rows (a batch entry with key length 0)",
     lambda b, h, m, n, rng: {"key_lengths": np.array([0] + [n] * (b - 1)), "causal": True}),
]


def _normal(rng, *shape, sigma=1.0):
    return rng.normal(0, sigma, shape)


def _heads(rng, b, h, m, n, d, sigma=1.0):
    return _normal(rng, b, h, m, d, sigma=sigma), _normal(rng, b, h, n, d, sigma=sigma)


def _huge_heads(rng, b, h, m, n, d=64):
    """q and k of integers in [-200, 200], d = 64: q·k/8 is about ±1e4 and exact in every dtype (bf16
    holds integers up to 256, fp32 sums them exactly below 2^24), so the logits carry no rounding."""
    return (rng.integers(-200, 201, (b, h, m, d)).astype(np.float64),
            rng.integers(-200, 201, (b, h, n, d)).astype(np.float64))


# ---------------------------------------------------------------- NumPy exercises
def scores_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for name, b, h, m, n, d in SHAPES:
            cases.append(Case(name, _heads(rng, b, h, m, n, d), dtype))
        cases.append(Case("non-contiguous q, k: (B, N, H, d) storage", _heads(rng, 2, 3, 37, 37, 64), dtype,
                          strided=True))
        cases.append(Case(f"huge scores (about ±{HUGE:g})", _huge_heads(rng, 1, 2, 9, 11), dtype))
    return cases


def masks_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for shape_name, b, h, m, n, _ in SHAPES[:3]:
            for mask_name, kwargs in MASKS:
                cases.append(Case(f"{mask_name}, {shape_name}", (_normal(rng, b, h, m, n, sigma=3),), dtype,
                                  kwargs=kwargs(b, h, m, n, rng)))
        cases.append(Case("causal, non-contiguous scores", (_normal(rng, 2, 3, 37, 37, sigma=3),), dtype,
                          kwargs={"causal": True}, strided=True))
    return cases


# ---------------------------------------------------------------- GEMM kernels (CUDA C and Triton)
def _gemm_scale(a, b, scale=1.0):
    """Σ_k |a_ik b_jk|: the size of the terms each score sums (cancellation is judged against it)."""
    return (abs(scale) * (np.abs(a) @ np.swapaxes(np.abs(b), -1, -2)),)


def gemm_cases(with_scale: bool):
    def cases(rng, dtypes):
        out = []
        for dtype in dtypes:
            for name, b, h, m, n, d in SHAPES + [("K = 100: the last K tile is partial", 1, 2, 40, 33, 100)]:
                kwargs = {"scale": 1 / np.sqrt(d)} if with_scale and d != 64 else {}
                out.append(Case(name, _heads(rng, b, h, m, n, d), dtype, kwargs=kwargs))
            out.append(Case("non-contiguous inputs: (B, N, H, d) storage", _heads(rng, 2, 3, 37, 45, 64), dtype,
                            strided=True))
        return out
    return cases


def gemm_hint(case, got, expected):
    if got.shape == expected.shape and np.allclose(got, expected * 8, rtol=1e-2) or np.allclose(
            got * 8, expected, rtol=1e-2):
        return "every score is off by a constant factor: is the scale applied once, as given?"
    if case.strided:
        return "only the non-contiguous case fails: use each tensor's batch, head and row strides."
    return None


# ---------------------------------------------------------------- fused scale + mask + softmax
def softmax_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for shape_name, b, h, m, n, d in SHAPES[:4]:
            for mask_name, kwargs in MASKS:
                cases.append(Case(f"{mask_name}, {shape_name}", (_normal(rng, b, h, m, n, sigma=3),), dtype,
                                  kwargs={"scale": 1 / np.sqrt(d), **kwargs(b, h, m, n, rng)}))
        s = rng.uniform(-HUGE, HUGE, (1, 2, 7, 300))
        cases.append(Case(f"huge logits: uniform in ±{HUGE:g}, scale 1/8, causal", (s,), dtype,
                          kwargs={"scale": 0.125, "causal": True}))
        cases.append(Case("long rows (1, 1, 3, 3000), key padding", (_normal(rng, 1, 1, 3, 3000, sigma=3),), dtype,
                          kwargs={"scale": 0.125, "key_lengths": np.array([2999])}))
        cases.append(Case("non-contiguous scores, causal", (_normal(rng, 2, 3, 37, 37, sigma=3),), dtype,
                          kwargs={"scale": 0.125, "causal": True}, strided=True))
    return cases


def softmax_hint(case, got, expected):
    if np.isnan(got).any() and not np.isnan(expected).any():
        return ("NaN where the answer is a number: a fully masked row has max = -inf and exp(-inf - (-inf)) is "
                "NaN; give such rows zeros." if "fully masked" in case.name else
                "NaN or inf: subtract the row's max before exp, and do not divide by a zero sum.")
    rows_off = np.abs(got - expected).max(axis=-1) > 1e-3
    if case.kwargs.get("causal") and rows_off.any() and np.abs(got - expected).max(axis=-2).argmax() >= 0:
        diagonal = np.diagonal(got, axis1=-2, axis2=-1)
        if np.abs(diagonal - np.diagonal(expected, axis1=-2, axis2=-1)).max() > 1e-3:
            return "the diagonal is wrong: query i may attend to key i itself (keep j <= i)."
    if "padding" in case.name:
        return "key padding masks keys (columns j >= key_lengths[b]), not queries (rows)."
    return None


# ---------------------------------------------------------------- composed attention
def _sdpa_error(q, k, v, dtype, kwargs):
    """Max error of PyTorch's own SDPA (math backend) in `dtype` against the float64 reference: the
    scale of FlashAttention's test rule."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    t = [torch.from_numpy(a).to(backend.DEVICE, getattr(torch, dtype)) for a in (q, k, v)]
    rounded = [x.double().cpu().numpy() for x in t]
    b, h, m, n = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    bias = ref.masked_scores(np.zeros((b, h, m, n)), kwargs.get("key_lengths"), kwargs.get("causal", False),
                             kwargs.get("alibi_slopes"))
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(
            *t, attn_mask=torch.from_numpy(bias).to(backend.DEVICE, getattr(torch, dtype)))
    expected = ref.attention(*rounded, **kwargs)
    return float(np.nan_to_num(np.abs(out.double().cpu().numpy() - expected), nan=0.0).max()), expected


def _flash_rule(q, k, v, dtype, kwargs):
    if dtype == "float32":
        return None
    err_pt, expected = _sdpa_error(q, k, v, dtype, kwargs)
    floor = UNIT_ROUNDOFF[dtype] * float(np.abs(expected).max(initial=0.0)) + 1e-5
    return (2 * err_pt + floor, 0.0, f"FlashAttention's rule: 2 × PyTorch's own {dtype} SDPA error "
            f"({err_pt:.2g}) + one rounding of the largest output ({floor:.2g})")


def attention_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for shape_name, b, h, m, n, d in SHAPES[1:]:
            for mask_name, kwargs in MASKS:
                q, k = _heads(rng, b, h, m, n, d)
                v = _normal(rng, b, h, n, d)
                kw = kwargs(b, h, m, n, rng)
                cases.append(Case(f"{mask_name}, {shape_name}", (q, k, v), dtype, _flash_rule(q, k, v, dtype, kw),
                                  kwargs=kw))
        extra = [("N = 1", *_heads(rng, 1, 1, 1, 1, 16), _normal(rng, 1, 1, 1, 16), {}, False),
                 (f"huge logits (about ±{HUGE:g}), causal", *_huge_heads(rng, 1, 2, 20, 20),
                  _normal(rng, 1, 2, 20, 64), {"causal": True}, False),
                 ("non-contiguous q, k, v, causal + padding", *_heads(rng, 2, 3, 37, 37, 64),
                  _normal(rng, 2, 3, 37, 64), {"causal": True, "key_lengths": np.array([37, 20])}, True)]
        for name, q, k, v, kw, strided in extra:
            cases.append(Case(name, (q, k, v), dtype, _flash_rule(q, k, v, dtype, kw), kwargs=kw, strided=strided))
    return cases


# ---------------------------------------------------------------- RoPE
def rope_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for name, b, h, _, n, d in SHAPES[:4] + [("300 positions, d = 64", 1, 2, 300, 300, 64)]:
            cases.append(Case(name, (_normal(rng, b, h, n, d), *ref.rope_tables(n, d)), dtype))
        cases.append(Case("non-contiguous x: (B, N, H, d) storage", (_normal(rng, 2, 3, 37, 64),
                                                                     *ref.rope_tables(37, 64)), dtype, strided=True))
    return cases


def rope_hint(case, got, expected):
    half = got.shape[-1] // 2
    if np.allclose(got[..., 0, :], expected[..., 0, :], atol=1e-2) and not np.allclose(got, expected, atol=1e-2):
        return "position 0 is right but later ones are not: check the angle's sign and the table row (position)."
    if not np.allclose(got[..., :half], expected[..., :half], atol=1e-2):
        return "pair element c with element c + d/2 (the two halves), not neighbours 2c and 2c + 1."
    return None


TASKS = {t.id: t for t in [
    Task("w35.attention_scores", "numpy", ("attention_scores",), scores_cases,
         lambda q, k: (ref.attention_scores(q, k),), banned=SDPA, hint=gemm_hint, dtypes=("float64", "float32"),
         scale=lambda q, k: _gemm_scale(q, k, 1 / np.sqrt(q.shape[-1]))),
    Task("w35.apply_masks", "numpy", ("apply_masks",), masks_cases, lambda s, **kw: (ref.masked_scores(s, **kw),),
         banned=SDPA, hint=softmax_hint, dtypes=("float64", "float32")),
    Task("w35.tiled_matmul", "cuda", ("TILED_MATMUL_SRC",), gemm_cases(False),
         lambda a, b: (a @ np.swapaxes(b, -1, -2),), writes_out=True, banned=MATMULS, hint=gemm_hint,
         dtypes=ALL_DTYPES, scale=_gemm_scale, out_shape=lambda a, b: (*a[:3], b[2])),
    Task("w35.qk_scores", "triton", ("qk_scores_kernel",), gemm_cases(True),
         lambda q, k, scale=1.0: (scale * (q @ np.swapaxes(k, -1, -2)),), writes_out=True, banned=MATMULS,
         hint=gemm_hint, dtypes=ALL_DTYPES, scale=_gemm_scale, out_shape=lambda q, k: (*q[:3], k[2])),
    Task("w35.scale_mask_softmax", "triton", ("scale_mask_softmax_kernel", "masked_row_softmax"), softmax_cases,
         ref.scale_mask_softmax, outputs=("p",), writes_out=True, banned=SOFTMAXES + SDPA, hint=softmax_hint,
         dtypes=ALL_DTYPES),
    Task("w35.cuda_scale_mask_softmax", "cuda", ("CUDA_SCALE_MASK_SOFTMAX_SRC",), softmax_cases,
         ref.scale_mask_softmax, outputs=("p",), writes_out=True, banned=SOFTMAXES + SDPA, hint=softmax_hint,
         dtypes=ALL_DTYPES),
    Task("w35.attention", "triton", ("pv_kernel", "attention"), attention_cases,
         lambda q, k, v, **kw: (ref.attention(q, k, v, **kw),), outputs=("o",), writes_out=True,
         banned=SOFTMAXES + SDPA + MATMULS, dtypes=ALL_DTYPES,
         scale=lambda q, k, v, **kw: (ref.attention_scale(q, k, v, **kw),)),
    Task("w35.rope", "triton", ("rope_kernel",), rope_cases, lambda x, cos, sin: ref.rope(x, cos, sin),
         writes_out=True, hint=rope_hint, dtypes=ALL_DTYPES),
]}
