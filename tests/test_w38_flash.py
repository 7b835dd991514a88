"""Week 38: the backward references against float64 autograd, the tiled backward's traffic against its closed form,
and the Triton kernels (forward with its switches, backward, autograd, varlen, split-K decoding) against the float64
references. CPU: the interpreter in float32; a GPU adds bfloat16."""
import numpy as np
import pytest
import torch

from course import backend
from course.mutants import declared
from course.w38_flash_attention_impl import reference as ref
from solutions import w38_flash_attention_impl as s

RNG = np.random.default_rng(38)
DTYPES = [torch.float32] + ([torch.bfloat16] if backend.ON_GPU else [])
UNIT = {torch.float32: 2e-5, torch.bfloat16: 2.0 ** -6}


def _t(x, dtype=torch.float32):
    return torch.from_numpy(np.ascontiguousarray(x)).to(backend.DEVICE, dtype)


def _np(t):
    return t.detach().double().cpu().numpy()


@pytest.mark.parametrize("causal", [False, True])
def test_reference_backward_equals_float64_autograd_with_grouped_heads(causal):
    q, k, v, do = (RNG.normal(size=shape) for shape in ((2, 4, 9, 8), (2, 2, 9, 8), (2, 2, 9, 8), (2, 4, 9, 8)))
    leaves = [torch.from_numpy(x).requires_grad_() for x in (q, k, v)]
    g = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=True)
    g.backward(torch.from_numpy(do))
    for mine, leaf in zip(ref.attention_backward(q, k, v, do, causal), leaves):
        np.testing.assert_allclose(mine, leaf.grad.numpy(), atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("blocks", [(16, 8), (8, 8), (32, 16)])
def test_tiled_backward_and_its_traffic(causal, blocks):
    q, k, v, do = (RNG.normal(size=(1, 2, 45, 16)) for _ in range(4))
    o, lse = ref.attention_forward(q, k, v, causal)
    *grads, traffic = ref.tiled_attention_backward(q, k, v, o, do, lse, *blocks, causal)
    for mine, right in zip(grads, ref.attention_backward(q, k, v, do, causal)):
        np.testing.assert_allclose(mine, right, atol=1e-12)
    assert (traffic["reads"], traffic["writes"]) == ref.backward_traffic(2, 45, 45, 16, *blocks, causal)


def test_merge_splits_of_disjoint_key_ranges_is_the_whole_attention():
    q, k, v = (RNG.normal(size=(1, 3, 5, 8)) for _ in range(3))
    k, v = np.concatenate([k, k * 2], axis=2), np.concatenate([v, -v], axis=2)
    parts = [ref.attention_forward(q, k[:, :, a:b], v[:, :, a:b]) for a, b in ref.split_bounds(10, 3, 2) if b > a]
    o, lse = ref.merge_splits(np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts]))
    whole = ref.attention_forward(q, k, v)
    np.testing.assert_allclose(o, whole[0], atol=1e-12)
    np.testing.assert_allclose(lse, whole[1], atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (3, 1)], ids=str)
def test_autograd_function_matches_float64(dtype, causal, heads):
    h, hkv = heads
    q, k, v, do = (RNG.normal(size=shape) for shape in ((2, h, 37, 32), (2, hkv, 37, 32), (2, hkv, 37, 32), (2, h, 37, 32)))
    leaves = [_t(x, dtype).requires_grad_() for x in (q, k, v)]
    o = s.flash_attn(*leaves, causal=causal)
    o.backward(_t(do, dtype))
    rq, rk, rv = (_np(t) for t in leaves)
    np.testing.assert_allclose(_np(o), ref.attention_forward(rq, rk, rv, causal)[0], atol=4 * UNIT[dtype])
    for leaf, right, size in zip(leaves, ref.attention_backward(rq, rk, rv, _np(_t(do, dtype)), causal),
                                 ref.gradient_scale(rq, rk, rv, _np(_t(do, dtype)), causal)):
        assert np.all(np.abs(_np(leaf.grad) - right) <= 8 * UNIT[dtype] * (size + 1e-3))


@pytest.mark.parametrize("switch", ["seq_parallel", "defer_norm", "exp2"])
def test_every_fa2_switch_computes_the_same_attention(switch):
    q, k, v = (_t(RNG.normal(size=(1, 2, 70, 64))) for _ in range(3))
    o, lse = s.flash_forward(q, k, v, True, **{switch: False})
    right = ref.attention_forward(*(_np(t) for t in (q, k, v)), True)
    np.testing.assert_allclose(_np(o), right[0], atol=1e-5)
    np.testing.assert_allclose(_np(lse), right[1], atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_forward_and_backward_skip_nothing_and_mix_nothing(causal):
    cu = np.array([0, 7, 7, 40, 41, 60])
    q, do = (RNG.normal(size=(60, 4, 16)) for _ in range(2))
    k, v = (RNG.normal(size=(60, 2, 16)) for _ in range(2))
    o, lse = s.varlen_forward(_t(q), _t(k), _t(v), cu, causal)
    right_o, right_lse = ref.varlen_attention(q, k, v, cu, causal)
    np.testing.assert_allclose(_np(o), right_o, atol=1e-5)
    np.testing.assert_allclose(_np(lse), right_lse, atol=1e-5)
    grads = s.varlen_backward(_t(q), _t(k), _t(v), _t(right_o), _t(do), _t(right_lse), cu, causal)
    for mine, right in zip(grads, ref.varlen_backward(q, k, v, do, cu, causal)):
        np.testing.assert_allclose(_np(mine), right, atol=2e-5)


@pytest.mark.parametrize("splits", [None, 1, 5])
def test_split_k_decoding_with_cache_lengths(splits):
    q = RNG.normal(size=(3, 8, 2, 32))
    k, v = (RNG.normal(size=(3, 2, 200, 32)) for _ in range(2))
    lengths = np.array([200, 1, 77])
    o, lse = s.flash_decode(_t(q), _t(k), _t(v), lengths, splits)
    for b, n in enumerate(lengths):
        right = ref.attention_forward(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n])
        np.testing.assert_allclose(_np(o)[b], right[0][0], atol=1e-5)
        np.testing.assert_allclose(_np(lse)[b], right[1][0], atol=1e-5)


def test_arguments_are_checked():
    q = torch.randn(1, 4, 8, 16, device=backend.DEVICE)
    other = lambda *shape: torch.randn(*shape, device=backend.DEVICE)  # noqa: E731
    with pytest.raises(ValueError, match="dividing"):
        s.flash_forward(q, other(1, 3, 8, 16), other(1, 3, 8, 16))
    with pytest.raises(ValueError, match="cu_seqlens"):
        s.varlen_forward(other(10, 2, 16), other(10, 2, 16), other(10, 2, 16), [0, 4, 9])
    with pytest.raises(ValueError, match="cache_lengths"):
        s.flash_decode(q[:, :, :1], other(1, 2, 8, 16), other(1, 2, 8, 16), [9])
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        s.tc_flash_attention(q.to(backend.DEVICE), q.to(backend.DEVICE), q.to(backend.DEVICE))
    with pytest.raises(ValueError, match="course.DEVICE"):  # a tensor the kernels cannot reach: said, not crashed
        s.flash_forward(torch.randn(1, 4, 8, 16, device="meta"), q.cpu(), q.cpu())


def test_every_week_38_mutant_names_the_hint_it_must_show():
    for mutant in declared("w38_flash_attention_impl"):
        assert mutant.hint or mutant.needs_gpu, f"{mutant.name}: no hint to check"


def test_tl_dot_becomes_wgmma_when_compiled_for_hopper():
    from course.triton_ptx import hopper_ptx, instruction_counts
    types = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "o_ptr": "*bf16", "lse_ptr": "*fp32", "cu_ptr": "*i32",
             "qk_scale": "fp32"}
    ptx = hopper_ptx("w38_flash_attention_impl", "flash_forward_kernel", types,
                     dict(BLOCK_M=128, BLOCK_N=64, BLOCK_D=64, CAUSAL=True, VARLEN=False, SEQ_PARALLEL=True, DEFER=True,
                          EXP2=True, STAGES=2, PRECISION="tf32"), num_warps=4)
    counts = instruction_counts(ptx)
    assert counts["wgmma (Hopper, a warpgroup's asynchronous MMA)"] > 0 and counts["TMA tile copy"] == 0
