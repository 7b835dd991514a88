"""Week 38's training harness: the corpus, the model's shapes, reproducible runs, and `compare` telling a
correct attention (equal to SDPA to float32 rounding) from a broken one (no causal mask)."""
import math

import matplotlib
import pytest
import torch

from course.w38_flash_attention_impl import train as t

STEPS, RUN = 3, dict(t.CPU_RUN)


def plain_attention(q, k, v):
    """softmax(Q Kᵀ / √d + causal mask) V in torch ops, K and V repeated for grouped-query attention."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    future = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v


def unmasked_attention(q, k, v):
    """The bug the lesson must catch: every query also sees the keys after it."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])


def test_corpus_is_deterministic_per_seed_and_the_vocab_round_trips():
    text = t.corpus(3000, seed=1)
    assert text == t.corpus(3000, seed=1) and text != t.corpus(3000, seed=2)
    assert len(text) == 3000 and set(text) <= set(t.VOCAB.chars)
    assert all(line[0].isupper() and line[-1] in ".!?" for line in text.splitlines()[:-1])
    ids = t.VOCAB.encode(text)
    assert ids.dtype == torch.long and ids.shape == (3000,) and int(ids.max()) < t.VOCAB.size
    assert t.VOCAB.decode(ids) == text
    with pytest.raises(ValueError, match="outside the vocabulary"):
        t.VOCAB.encode("Zebra")


def test_model_shapes_and_the_calls_to_attend():
    config = t.CPU_CONFIG
    seen = []

    def recording_attention(q, k, v):
        seen.append((tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        return t.sdpa_attention(q, k, v)

    model = t.TinyGPT(config, recording_attention)
    logits = model(torch.randint(config.vocab, (3, 17)))
    assert logits.shape == (3, 17, config.vocab)
    d = config.width // config.heads
    kv_shape = (3, config.kv_heads, 17, d)
    assert seen == [((3, config.heads, 17, d), kv_shape, kv_shape)] * config.layers
    assert model.head.weight is model.tokens.weight
    with pytest.raises(ValueError, match="kv_heads"):
        t.Config(vocab=10, layers=1, heads=4, kv_heads=3, width=64, context=8)
    with pytest.raises(ValueError, match="context"):
        model(torch.zeros(1, config.context + 1, dtype=torch.long))


def test_same_seed_same_run():
    first = t.train(t.sdpa_attention, t.CPU_CONFIG, STEPS, seed=0, **RUN)
    second = t.train(t.sdpa_attention, t.CPU_CONFIG, STEPS, seed=0, **RUN)
    other_seed = t.train(t.sdpa_attention, t.CPU_CONFIG, STEPS, seed=1, **RUN)
    assert first.loss == second.loss and first.grad_norm == second.grad_norm
    assert all((a == b).all() for a, b in zip(first.grad_probe, second.grad_probe, strict=True))
    assert first.loss != other_seed.loss
    assert len(first.loss) == len(first.grad_norm) == len(first.grad_probe) == STEPS
    assert first.grad_probe[0].dtype == "float64" and 0 < first.grad_probe[0].size <= t.GRAD_PROBE_SIZE


def test_plain_attention_matches_sdpa_step_by_step():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, heads, 37, 16, generator=g) for heads in (4, 2, 2))
    torch.testing.assert_close(plain_attention(q, k, v), t.sdpa_attention(q, k, v), atol=1e-6, rtol=1e-5)
    frame = t.compare(plain_attention, t.sdpa_attention, t.CPU_CONFIG, STEPS, **RUN)
    assert list(frame.columns[:3]) == ["loss_a", "loss_b", "loss_diff"] and len(frame) == STEPS
    assert frame["loss_diff"].max() < 1e-5
    assert frame["grad_rel_diff"].max() < 1e-4


def test_loss_falls_in_30_steps():
    history = t.train(t.sdpa_attention, t.CPU_CONFIG, 30, seed=0, **RUN, log_grads=False)
    assert history.grad_norm == [] and history.grad_probe == []
    assert history.loss[0] == pytest.approx(math.log(t.VOCAB.size), abs=0.3)  # a uniform guess at first
    assert sum(history.loss[-5:]) / 5 < history.loss[0] - 1.0


def test_compare_catches_a_missing_causal_mask():
    frame = t.compare(unmasked_attention, t.sdpa_attention, t.CPU_CONFIG, 10, **RUN)
    assert frame["loss_diff"].max() > 5e-3  # float32 rounding alone stays under 1e-5
    assert frame["grad_rel_diff"].min() > 0.1  # the gradient shows it from the first step


def test_bfloat16_autocast_hands_attend_bf16():
    dtypes = []

    def recording_attention(q, k, v):
        dtypes.append((q.dtype, k.dtype, v.dtype))
        return t.sdpa_attention(q, k, v)

    history = t.train(recording_attention, t.CPU_CONFIG, 2, seed=0, dtype=torch.bfloat16, **RUN)
    assert set(dtypes) == {(torch.bfloat16,) * 3}
    assert history.model.blocks[0].attention.qkv.weight.dtype == torch.float32
    assert all(math.isfinite(loss) for loss in history.loss)
    with pytest.raises(ValueError, match="float16"):
        t.train(t.sdpa_attention, t.CPU_CONFIG, 1, seed=0, dtype=torch.float16, **RUN)


def test_plot_and_sample():
    matplotlib.use("Agg")
    frame = t.compare(t.sdpa_attention, t.sdpa_attention, t.CPU_CONFIG, STEPS, **RUN)
    ax = t.plot_losses(frame, ["course", "sdpa"])
    assert [line.get_label() for line in ax.get_lines()][:2] == ["course", "sdpa"]
    assert list(ax.get_lines()[1].get_ydata()) == list(frame["loss_b"])
    model = frame.attrs["histories"][0].model
    text = t.sample(model, t.VOCAB, "The ", 20, seed=3)
    assert text.startswith("The ") and len(text) == 24 and text == t.sample(model, t.VOCAB, "The ", 20, seed=3)
    greedy = t.sample(model, t.VOCAB, "The ", 5, temperature=0)
    assert greedy == t.sample(model, t.VOCAB, "The ", 5, temperature=0, seed=9)
