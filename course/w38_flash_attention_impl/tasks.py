"""Graded tasks of week 38. Gradients are judged against the size of the terms they sum (they cancel: each row
of dS sums to zero), references are float64, and a failure is diagnosed by comparing the output with what each
known bug would have produced on the same inputs (grading.diagnose). The dK/dV and dQ kernels are graded in
isolation: the case hands them the LSE and D computed in float64, so a bug elsewhere cannot fail them.
Adversarial cases: N = 1, lengths no block divides, M != N, causal, non-contiguous storage, grouped-query heads,
logits near -1e4 (an unshifted exp underflows), partial states that saw no key."""
import math

import numpy as np

from ..grading import RACE, TOLERANCES, Case, GradingError, Task, diagnose
from ..w35_attention_blocks.tasks import MATMULS, SDPA, SOFTMAXES, flash_rule, huge_heads, normal_heads
from ..w37_flash_attention_core.tasks import flash_cases, linear_memory, negative_heads, sixteen_bit_rule
from . import reference as ref

NUMPY_DTYPES = ("float64", "float32")
TRITON_DTYPES = ("float32", "float16", "bfloat16")
BANNED = SOFTMAXES + SDPA + MATMULS + ("torch.autograd.grad", "torch.Tensor.backward")

# (name, B, H, Hkv, M, N, d): the shapes every backward exercise sweeps
SHAPES = [("N = 1", 1, 1, 1, 1, 1, 16), ("odd lengths (2, 3, 37, 37, 64)", 2, 3, 3, 37, 37, 64),
          ("M = 45 queries, N = 70 keys, d = 16", 1, 2, 2, 45, 70, 16), ("M = 70, N = 45, d = 32", 1, 2, 2, 70, 45, 32),
          ("several blocks each way (1, 2, 130, 200, 64)", 1, 2, 2, 130, 200, 64)]
GQA_SHAPES = [("grouped-query: 4 query heads share 2 key/value heads", 2, 4, 2, 37, 37, 64),
              ("multi-query: 6 query heads share 1", 1, 6, 1, 45, 45, 32)]


def _rounded(x, dtype):
    """x rounded to dtype and back to float64 (what the kernel will see once the grader casts it)."""
    import torch
    return torch.from_numpy(np.ascontiguousarray(x)).to(getattr(torch, dtype)).double().numpy()


def _logit_rule(q, k, dtype):
    """The dtype's tolerance, widened for large logits: the float32 LSE and the base-2 logits round at about
    |t|·2⁻²⁴ in the exponent, so each recomputed probability carries a relative error of about 8·L·2⁻²⁴."""
    atol, rtol, why = TOLERANCES[dtype]
    if dtype == "float64":  # the LSE and the logits are float64 too: nothing to widen
        return None
    largest = float(np.abs(ref.attention_scores(q, ref.expand_kv(k, q.shape[1]))).max(initial=0.0))
    if 8 * largest * 2.0 ** -24 <= rtol:
        return None
    return atol, 8 * largest * 2.0 ** -24, f"{why}; logits up to {largest:.3g}: 8·L·2⁻²⁴ in every probability"


# ---------------------------------------------------------------- diagnosis: what known bugs produce
def backward_variants(q, k, v, do, causal=False, **_):
    """hint -> (dq, dk, dv) that a known backward bug produces on these inputs (an entry may be a list of the
    forms the bug can take). As in the kernels, D comes from the true O unless the bug is in D, and a wrongly
    recomputed P is used as it comes (a kernel never renormalises it)."""
    heads, d = q.shape[1], q.shape[-1]
    scale = 1 / math.sqrt(d)
    ke, ve = ref.expand_kv(k, heads), ref.expand_kv(v, heads)
    logits = ref.attention_scores(q, ke)
    s = ref.masked_scores(logits, causal=causal)
    p = ref.softmax_rows(s)
    lse = ref.log_sum_exp(q, ke, causal)[..., None]
    true_d = ref.delta(p @ ve, do)
    fold = lambda g: g.reshape(g.shape[0], k.shape[1], -1, *g.shape[2:]).sum(axis=2)  # noqa: E731
    t = lambda x: np.swapaxes(x, -1, -2)  # noqa: E731

    def grads(p, big_d=true_d):
        ds = p * (do @ t(ve) - big_d[..., None])
        return scale * ds @ ke, fold(scale * t(ds) @ q), fold(t(p) @ do)

    def kept(keep):  # P = exp(S - lse) under another mask, as a kernel with that mask computes it
        m, n = s.shape[-2:]
        with np.errstate(over="ignore"):
            return np.where(keep(np.arange(n)[None, :], np.arange(m)[:, None]), np.exp(logits - lse), 0.0)

    dq, dk, dv = grads(p)
    out = {"dS = P ∘ dP: D = rowsum(dO ∘ O) was not subtracted": grads(p, np.zeros(true_d.shape)),
           "the softmax scale 1/√d is missing from dQ or dK (dS is the gradient of the scaled scores)":
               (dq / scale, dk / scale, dv),
           "dQ or dK multiplied by the scale twice": (dq * scale, dk * scale, dv)}
    with np.errstate(over="ignore", invalid="ignore"):
        out["P recomputed as exp(S) without the log-sum-exp: use exp(S − lse)"] = grads(np.where(np.isfinite(s),
                                                                                              np.exp(s), 0.0))
    if q.shape[2] == v.shape[2] and heads == k.shape[1]:
        out["D computed from dO ∘ V: it is rowsum(dO ∘ O)"] = grads(p, (do * ve).sum(-1))
    if causal:
        out["causal mask off by one in the backward: the diagonal was masked"] = grads(kept(np.less))
        out["causal mask off by one in the backward: one key past the diagonal was kept"] = \
            grads(kept(lambda j, i: j <= i + 1))
        out["no causal mask in the backward (every key counted)"] = grads(kept(lambda j, i: j >= 0))
    if heads != k.shape[1]:  # one program per query head, each storing its own dK, dV: the last one wins
        g = heads // k.shape[1]
        ds = p * (do @ t(ve) - true_d[..., None])
        dk_h, dv_h = scale * t(ds) @ q, t(p) @ do
        out["dK, dV hold one query head's gradient, not the sum over the heads of the group: accumulate across "
            "the group (programs that each store their own head overwrite each other)"] = \
            (dq, [dk_h[:, j::g] for j in range(g)], [dv_h[:, j::g] for j in range(g)])
    return out


def backward_hint(case, got, expected):
    q, k, v = case.inputs[:3]
    do = case.inputs[3] if len(case.inputs) == 4 else case.inputs[4]  # (q, k, v, do) or (q, k, v, o, do, lse)
    index = ("dq", "dk", "dv").index(case.output)
    variants = backward_variants(q, k, v, do, **case.kwargs)
    return diagnose(got, expected, {h: outs[index] for h, outs in variants.items()}) or (
        "no known bug matches this output. Check the pieces one at a time against day 1's formulas: "
        "P = exp(S − lse), dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − D), dQ = scale · dS K, dK = scale · dSᵀ Q.")


def forward_variants(q, k, v, causal=False, **_):
    """hint -> (o, lse) that a known forward bug produces, including the grouped-query head mappings."""
    heads, kv_heads = q.shape[1], k.shape[1]
    out = {}
    o, lse = ref.attention_forward(q, k, v, causal)
    out["the log-sum-exp is in base 2: divide m + log2(l) by log2(e) for the natural log"] = (o, lse * math.log2(math.e))
    out["the scale 1/√d is missing"] = ref.attention_forward(q, k, v, causal, scale=1.0)
    if causal:
        out["no causal mask"] = ref.attention_forward(q, k, v, False)
        ke, ve = ref.expand_kv(k, heads), ref.expand_kv(v, heads)
        m, n = q.shape[2], k.shape[2]
        s = np.where(np.arange(n)[None, :] < np.arange(m)[:, None], ref.attention_scores(q, ke), -np.inf)
        top = s.max(-1, keepdims=True)
        safe = np.where(np.isfinite(top), top, 0.0)
        with np.errstate(divide="ignore"):
            out["causal mask off by one: the diagonal was masked (query i sees key i)"] = (
                ref.softmax_rows(s) @ ve, (safe + np.log(np.exp(s - safe).sum(-1, keepdims=True)))[..., 0])
    if heads != kv_heads:
        group = heads // kv_heads
        for name, mapping in ((f"key/value head h % Hkv (interleaved): query heads h·G … h·G + G − 1 share head h, "
                               f"so it is h // G with G = H / Hkv = {group}", lambda h: h % kv_heads),
                              ("every query head reads key/value head 0: that is multi-query attention (Hkv = 1) "
                               "only", lambda h: 0)):
            index = [mapping(h) for h in range(heads)]
            out[name] = ref.attention_forward(q, k[:, index], v[:, index], causal)
    return out


def forward_hint(case, got, expected):
    index = ("o", "lse").index(case.output)
    seen = (_rounded(x, case.dtype) for x in case.inputs)  # what the kernel computed with, after the grader's cast
    variants = forward_variants(*seen, **case.kwargs)
    return diagnose(got, expected, {h: outs[index] for h, outs in variants.items()}) or (
        "no known bug matches this output: compare your online-softmax update with week 37's (rescale l and the "
        "accumulator by exp2(m_old − m_new), divide by l at the end).")


# ---------------------------------------------------------------- cases
def _backward_inputs(rng, dtype, b, h, hkv, m, n, d, causal, logits=None):
    """(q, k, v, do) rounded to dtype and the float32 LSE and D of the rounded values (float64 math)."""
    q, k = logits if logits is not None else normal_heads(rng, b, h, m, n, d)
    if k.shape[1] != hkv:
        k = k[:, :hkv]
    v, do = rng.normal(0, 1, (b, hkv, n, d)), rng.normal(0, 1, (b, h, m, d))
    q, k, v, do = (_rounded(x, dtype) for x in (q, k, v, do))
    o, lse = ref.attention_forward(q, k, v, causal)
    return (q, k, v, do), {"lse": lse.astype(np.float32), "delta": ref.delta(o, do).astype(np.float32),
                           "causal": causal}


def kernel_backward_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for name, b, h, hkv, m, n, d in SHAPES + GQA_SHAPES:
            for causal in (False, True):
                inputs, kw = _backward_inputs(rng, dtype, b, h, hkv, m, n, d, causal)
                cases.append(Case(f"{'causal' if causal else 'no mask'}, {name}", inputs, dtype, kwargs=kw))
        inputs, kw = _backward_inputs(rng, dtype, 2, 3, 3, 37, 37, 64, True)
        cases.append(Case("non-contiguous q, k, v, dO, causal", inputs, dtype, kwargs=kw, strided=True))
        inputs, kw = _backward_inputs(rng, dtype, 1, 1, 1, 40, 40, 64, False, logits=negative_heads(rng, 1, 1, 40, 40))
        cases.append(Case("all logits about -1e4", inputs, dtype, _logit_rule(inputs[0], inputs[1], dtype), kwargs=kw))
    return cases


def numpy_backward_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for (name, b, h, _, m, n, d), (bm, bn) in zip(SHAPES, ((16, 16), (16, 8), (8, 32), (32, 16), (32, 64))):
            for causal in (False, True):
                (q, k, v, do), kw = _backward_inputs(rng, dtype, b, h, h, m, n, d, causal)
                o, lse = ref.attention_forward(q, k, v, causal)
                cases.append(Case(f"{'causal' if causal else 'no mask'}, {name}, blocks {bm} × {bn}", (q, k, v, o, do, lse),
                                  dtype, kwargs={"block_m": bm, "block_n": bn, "causal": causal}))
        (q, k, v, do), _ = _backward_inputs(rng, dtype, 1, 1, 1, 12, 20, 64, False, logits=negative_heads(rng, 1, 1, 12, 20))
        o, lse = ref.attention_forward(q, k, v)
        cases.append(Case("all logits about -1e4", (q, k, v, o, do, lse), dtype, _logit_rule(q, k, dtype),
                          kwargs={"block_m": 8, "block_n": 8, "causal": False}))
    return cases


def delta_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for name, b, h, m, d in (("N = 1", 1, 1, 1, 16), ("odd lengths (2, 3, 37, 64)", 2, 3, 37, 64),
                                 ("d = 100, 70 rows", 1, 2, 70, 100), ("d = 128, 130 rows", 1, 2, 130, 128)):
            cases.append(Case(name, (rng.normal(0, 1, (b, h, m, d)), rng.normal(0, 1, (b, h, m, d))), dtype))
        cases.append(Case("non-contiguous o, dO", (rng.normal(0, 1, (2, 3, 37, 64)), rng.normal(0, 1, (2, 3, 37, 64))),
                          dtype, strided=True))
    return cases


def delta_hint(case, got, expected):
    o, do = case.inputs
    return diagnose(got, expected, {
        "D is rowsum(dO ∘ O): the product of the two, summed over the head dimension": (do * do).sum(-1),
        "D is rowsum(dO ∘ O), not rowsum(O ∘ O)": (o * o).sum(-1),
        "D has no softmax scale: it is rowsum(dO ∘ O) exactly": (o * do).sum(-1) / math.sqrt(o.shape[-1]),
        "sum the elementwise product, not the product of the two sums": o.sum(-1) * do.sum(-1)})


def forward_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for name, b, h, hkv, m, n, d in GQA_SHAPES + [("8 query heads share 2, M = 70, N = 45", 1, 8, 2, 70, 45, 32),
                                                      ("no grouping (H = Hkv = 3), odd lengths", 2, 3, 3, 37, 37, 64),
                                                      ("N = 1, 2 query heads share 1", 1, 2, 1, 1, 1, 16)]:
            for causal in (False, True):
                q, k = normal_heads(rng, b, h, m, n, d)
                k, v = k[:, :hkv], rng.normal(0, 1, (b, hkv, n, d))
                kw = {"causal": causal}
                cases.append(Case(f"{'causal' if causal else 'no mask'}, {name}", (q, k, v), dtype,
                                  sixteen_bit_rule(q, ref.expand_kv(k, h), ref.expand_kv(v, h), dtype, kw), kwargs=kw))
        q, k = normal_heads(rng, 2, 4, 37, 37, 64)
        k, v = k[:, :2], rng.normal(0, 1, (2, 2, 37, 64))
        cases.append(Case("non-contiguous, grouped-query, causal", (q, k, v), dtype,
                          sixteen_bit_rule(q, ref.expand_kv(k, 4), ref.expand_kv(v, 4), dtype, {"causal": True}),
                          kwargs={"causal": True}, strided=True))
    return cases


def merge_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for name, parts, shape, sigma in (("one part", 1, (3, 4), 3), ("four parts", 4, (2, 5), 3),
                                          ("sixteen parts, one row", 16, (1,), 3), ("log-sum-exps of about ±1e4", 3, (4, 2), 1e4)):
            cases.append(Case(name, (rng.normal(0, 1, (parts, *shape, 8)), rng.normal(0, sigma, (parts, *shape))), dtype))
        lse = rng.normal(0, 3, (3, 4, 6))
        lse[1] = -np.inf        # a part whose keys were all masked (or past the cache's end)
        lse[:, 2] = -np.inf     # a row no part saw
        o = np.where(np.isfinite(lse)[..., None], rng.normal(0, 1, (3, 4, 6, 8)), 0.0)
        cases.append(Case("a part that saw no key, and a row no part saw", (o, lse), dtype))
    return cases


def merge_hint(case, got, expected):
    o, lse = (_rounded(x, case.dtype) for x in case.inputs)
    right = ref.merge_splits(o, lse)
    index = ("o", "lse").index(case.output)
    with np.errstate(all="ignore"):
        top = lse.max(axis=0)
        unshifted = np.exp(lse - top)  # NaN where every part is -inf
        raw = np.exp(lse)  # no shift: overflows to inf or underflows to 0
        raw_total = np.where(raw.sum(0) > 0, raw.sum(0), 1.0)
        variants = {
            "NaN on a row that no part saw: exp(-inf − (-inf)); shift by 0 where the largest lse is -inf":
                ((unshifted[..., None] * o).sum(0) / unshifted.sum(0)[..., None], top + np.log(unshifted.sum(0))),
            "the parts were averaged: weight each by exp(lse_s − lse), its share of the total sum":
                (o.mean(axis=0), right[1]),
            "merged lse = the largest part's: add log Σ_s exp(lse_s − max) to it": (right[0], top),
            "exp(lse) overflows (or underflows) for large log-sum-exps: subtract the largest before exponentiating":
                ((raw[..., None] * o).sum(0) / raw_total[..., None], np.where(raw.sum(0) > 0, np.log(raw_total), -np.inf)),
            "the weighted parts were not divided by the total weight": ((unshifted[..., None] * o).sum(0), right[1])}
        return diagnose(got, expected, {h: outs[index] for h, outs in variants.items()})


# (name, B, H, M, N, d): head dims the tensor-core kernel takes (multiples of 16 up to 128); the rest of the sweep
# (huge and very negative logits, non-contiguous inputs) is week 37's
TC_SHAPES = (("N = 1", 1, 1, 1, 1, 64), ("odd lengths (2, 3, 37, 37, 64)", 2, 3, 37, 37, 64),
             ("M = 45, N = 70, d = 16", 1, 2, 45, 70, 16), ("M = 70, N = 45, d = 32", 1, 2, 70, 45, 32),
             ("d = 128, several tiles (1, 2, 130, 200)", 1, 2, 130, 200, 128), ("d = 96, N = 77", 1, 2, 100, 77, 96))


def tc_cases(rng, dtypes):
    return flash_cases(rng, dtypes, TC_SHAPES)


def _numpy_backward_reference(q, k, v, o, do, lse, causal=False, **_):
    return ref.attention_backward(q, k, v, do, causal)


def _numpy_backward_scale(q, k, v, o, do, lse, causal=False, **_):
    return ref.gradient_scale(q, k, v, do, causal)


def _dkdv_reference(q, k, v, do, causal=False, **_):
    return ref.attention_backward(q, k, v, do, causal)[1:]


def _dkdv_scale(q, k, v, do, causal=False, **_):
    return ref.gradient_scale(q, k, v, do, causal)[1:]


def _dq_reference(q, k, v, do, causal=False, **_):
    return ref.attention_backward(q, k, v, do, causal)[:1]


def _dq_scale(q, k, v, do, causal=False, **_):
    return ref.gradient_scale(q, k, v, do, causal)[:1]


def _delta_reference(o, do):
    return (ref.delta(o, do),)


def _delta_scale(o, do):
    return (np.abs(o * do).sum(-1),)


def _forward_reference(q, k, v, causal=False):
    return ref.attention_forward(q, k, v, causal)


def many_tiles(fn):
    """On a GPU: the cases are small, and a race between the warps of a block (a missing barrier between copies and
    their use) shows only when many tiles stream through many blocks. Run (4, 16, 1024, 64) in bf16, causal and not,
    twice: the error must stay within FlashAttention's rule (2 × PyTorch's own bf16 error + one rounding) and the
    two runs must agree bit for bit."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(38)
    for causal in (False, True):
        q, k, v = (torch.randn(4, 16, 1024, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        first, second = fn(q, k, v, causal=causal)[0], fn(q, k, v, causal=causal)[0]
        right = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        peer = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        err, allowed = (first.float() - right).abs().max().item(), 2 * (peer.float() - right).abs().max().item() + 2 ** -8
        moved = not torch.equal(first, second)
        if err > allowed or moved:
            shape = f"(4, 16, 1024, 64), bfloat16{', causal' if causal else ''}"
            why = (f" and {RACE}" if moved else ": every small case passed, so look at what only many tiles and many "
                   "blocks exercise (the pipeline's stages, the causal order of the blocks).")
            raise GradingError(f"the small cases pass, but at scale {shape} the largest error is {err:.3g} against "
                               f"{allowed:.3g} allowed{why}")


def _tc_gpu_checks(fn):
    many_tiles(fn)
    linear_memory(fn)


TASKS = {t.id: t for t in [
    Task("w38.tiled_attention_backward", "numpy", ("tiled_attention_backward",), numpy_backward_cases,
         _numpy_backward_reference, outputs=("dq", "dk", "dv"), banned=BANNED, hint=backward_hint,
         dtypes=NUMPY_DTYPES,
         scale=_numpy_backward_scale),
    Task("w38.attention_delta", "triton", ("attention_delta_kernel",), delta_cases, _delta_reference, outputs=("D",),
         banned=BANNED, hint=delta_hint, dtypes=TRITON_DTYPES, scale=_delta_scale),
    Task("w38.flash_dkdv", "triton", ("_dkdv_blocks",), kernel_backward_cases, _dkdv_reference, outputs=("dk", "dv"),
         banned=BANNED, hint=backward_hint, dtypes=TRITON_DTYPES, scale=_dkdv_scale),
    Task("w38.flash_dq", "triton", ("_dq_blocks",), kernel_backward_cases, _dq_reference, outputs=("dq",),
         banned=BANNED, hint=backward_hint, dtypes=TRITON_DTYPES, scale=_dq_scale),
    Task("w38.flash_forward", "triton", ("kv_head_of",), forward_cases, _forward_reference, outputs=("o", "lse"),
         banned=BANNED, hint=forward_hint, dtypes=TRITON_DTYPES, gpu_check=linear_memory),
    Task("w38.merge_splits", "numpy", ("merge_splits",), merge_cases, ref.merge_splits, outputs=("o", "lse"),
         banned=BANNED, hint=merge_hint, dtypes=NUMPY_DTYPES),
    Task("w38.tc_flash_attention", "cuda", ("TC_FLASH_ATTENTION_SRC",), tc_cases, _forward_reference,
         outputs=("o", "lse"), banned=BANNED, hint=forward_hint, dtypes=("float16", "bfloat16"),
         gpu_check=_tc_gpu_checks),
]}
