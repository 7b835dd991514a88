"""Graded task of week 40, day 6: the capstone block assembled from the course's kernels. It is judged against the
float64 block (reference.capstone_block); in 16 bits with FlashAttention's test rule applied to PyTorch's own block
in that dtype. A failure is diagnosed by running the float64 block with each known assembly slip on the case's own
inputs."""
import numpy as np

from ..grading import Case, Task, diagnose, seen
from ..w35_attention_blocks import reference as ref35
from . import reference as ref

POST_NORM = ("the norm is applied after the residual add (post-norm): a pre-norm block normalises the branch's input, "
             "h = x + attention(RMSNorm(x)), and adds the raw x")
ROPE_ON_V = "v is rotated too: RoPE turns only q and k (positions enter through the scores)"
NO_ROPE = "q and k are not rotated: apply RoPE to both before attention"
GATE_UP = ("gate and up are swapped: the first F rows of w_gate_up make the gate, silu(gate)·up, so silu goes on "
           "y·W_gateᵀ")
NOT_CAUSAL = "the attention is not causal: a token sees only itself and the tokens before it"
HEADS = ("q, k and v are split the wrong way: y·W_qkvᵀ holds q, k, v one after the other (view (B, N, 3, H, d)), "
         "each of them H heads of d")
NO_RESIDUAL = "a residual add is missing: h = x + attention branch, out = h + MLP branch"
NORM2_OF_X = "the MLP's norm reads x: it normalises h, the residual stream after the attention branch"
TRANSPOSED_W = "a weight is used untransposed: a linear layer computes y·Wᵀ with W (out_features, in_features)"


def _block(x, w_norm1, w_qkv, w_o, w_norm2, w_gate_up, w_down, n_heads, causal=True, post_norm=False, rope_v=False,
           rope=True, swap=False, heads_last=False, residual=(True, True), norm2_of_x=False):
    """The float64 block with the slips above switched on."""
    bsz, n, c = x.shape
    d = c // n_heads
    norm = (lambda t, w: t) if post_norm else ref.rms_norm
    projected = norm(x, w_norm1) @ w_qkv.T
    qkv = projected.reshape(bsz, n, n_heads, 3, d).transpose(3, 0, 2, 1, 4) if heads_last else \
        projected.reshape(bsz, n, 3, n_heads, d).transpose(2, 0, 3, 1, 4)
    cos, sin = ref35.rope_tables(n, d)
    turn = (lambda t: ref35.rope(t, cos, sin)[0]) if rope else (lambda t: t)
    q, k, v = turn(qkv[0]), turn(qkv[1]), turn(qkv[2]) if rope_v else qkv[2]
    attn, _ = ref.masked_attention(q, k, v, ref.token_mask(n, n, causal))
    h = (x if residual[0] else 0) + attn.transpose(0, 2, 1, 3).reshape(bsz, n, c) @ w_o.T
    if post_norm:
        h = ref.rms_norm(h, w_norm1)
    gate, up = np.split(norm(x if norm2_of_x else h, w_norm2) @ w_gate_up.T, 2, axis=-1)
    if swap:
        gate, up = up, gate
    out = (h if residual[1] else 0) + (gate / (1 + np.exp(-gate)) * up) @ w_down.T
    return ref.rms_norm(out, w_norm2) if post_norm else out


def capstone_variants(x, w_norm1, w_qkv, w_o, w_norm2, w_gate_up, w_down, n_heads):
    weights = (x, w_norm1, w_qkv, w_o, w_norm2, w_gate_up, w_down, n_heads)
    slips = {POST_NORM: {"post_norm": True}, ROPE_ON_V: {"rope_v": True}, NO_ROPE: {"rope": False},
             GATE_UP: {"swap": True}, NOT_CAUSAL: {"causal": False}, HEADS: {"heads_last": True},
             NORM2_OF_X: {"norm2_of_x": True}}
    with np.errstate(all="ignore"):
        out = {hint: [_block(*weights, **slip)] for hint, slip in slips.items()}
        out[NO_RESIDUAL] = [_block(*weights, residual=kept) for kept in ((False, False), (False, True), (True, False))]
        if w_o.shape[0] == w_o.shape[1]:
            out[TRANSPOSED_W] = [_block(x, w_norm1, w_qkv, w_o.T, w_norm2, w_gate_up, w_down, n_heads)]
    return out


def capstone_hint(case, got, expected):
    return diagnose(got, expected, capstone_variants(*seen(case), **case.kwargs))


def block_rule(x, w_norm1, w_qkv, w_o, w_norm2, w_gate_up, w_down, n_heads, dtype):
    """16 bits: FlashAttention's test rule on PyTorch's own block in the dtype (every intermediate rounded as eager
    PyTorch rounds it): twice its largest error plus one rounding of the largest output. float32: twice that
    block's error in float32 plus the dtype's tolerance (a block is a chain of sums over C, F and N terms)."""
    import torch
    tdt = getattr(torch, dtype)
    t = [torch.from_numpy(np.asarray(a, dtype=np.float64)).to(tdt) for a in (x, w_norm1, w_qkv, w_o, w_norm2,
                                                                               w_gate_up, w_down)]
    cos, sin = (torch.from_numpy(a).to(tdt) for a in ref35.rope_tables(x.shape[1], x.shape[2] // n_heads))
    with torch.no_grad():
        out = ref.torch_block(*t, n_heads, cos, sin).double().numpy()
    exact = ref.capstone_block(*(a.double().numpy() for a in t), n_heads=n_heads)[0]
    err = float(np.abs(out - exact).max())
    unit = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[dtype]
    floor = unit * float(np.abs(exact).max()) + 1e-5
    return (2 * err + floor, 0.0, f"FlashAttention's rule on PyTorch's block in {dtype}: 2 × its error ({err:.2g}) "
            f"+ one rounding of the largest output ({floor:.2g})")


# (name, B, N, C, heads, F)
CAPSTONE_SHAPES = (("one token", 1, 1, 32, 2, 48), ("B = 2, N = 7 (odd), C = 32, 2 heads", 2, 7, 32, 2, 40),
                   ("N = 33, C = 64, 4 heads of 16, F = 96", 1, 33, 64, 4, 96))


def capstone_cases(rng, dtypes):
    cases = []
    for dtype in dtypes:
        for name, b, n, c, heads, f in CAPSTONE_SHAPES:
            weights = (rng.normal(1, 0.2, c), rng.normal(0, c ** -0.5, (3 * c, c)), rng.normal(0, c ** -0.5, (c, c)),
                       rng.normal(1, 0.2, c), rng.normal(0, c ** -0.5, (2 * f, c)), rng.normal(0, f ** -0.5, (c, f)))
            x = rng.normal(0, 1, (b, n, c))
            cases.append(Case(name, (x, *weights), dtype, block_rule(x, *weights, heads, dtype),
                              kwargs={"n_heads": heads}))
    return cases


CAPSTONE_TASKS = [
    Task("w40.capstone_block", "triton", ("capstone_block",), capstone_cases, ref.capstone_block, outputs=("out",),
         hint=capstone_hint, dtypes=("float32", "float16", "bfloat16"),
         banned=("torch.nn.functional.scaled_dot_product_attention", "torch.nn.functional.rms_norm",
                 "torch.nn.functional.silu", "torch.nn.functional.dropout"),
         builds_on=("w34_layernorm", "w35_attention_blocks", "w38_flash_attention_impl", "w39_kernel_fusion")),
]
