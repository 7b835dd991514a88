"""Train a tiny character-level GPT twice, once per attention function, and compare the runs step by step.

The attention is a constructor argument, `attend(q, k, v)`: q (B, heads, T, d), k and v (B, kv_heads, T, d)
(grouped-query attention when kv_heads < heads), causal, returning (B, heads, T, d). Everything else (weights,
batches, optimiser) comes from one seed, so two runs differ only by their attention. The text is generated
by a small grammar here, in code: no downloads.

    frame = compare(my_attention, sdpa_attention, CPU_CONFIG, 20, **CPU_RUN)

Training is chaotic: a rounding difference grows step by step until the runs part (measured on an H100,
GPU preset, correct attention against SDPA: in bf16 |Δloss| ~1e-4 and gradients within ~1e-2 for about 25
steps; in fp32 without TF32 about 100 steps). Compare early steps one by one; later ones only as curves.
"""
import math
import random
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

# the grammar: "The small cat sees a dog, but my robot sleeps." / "Does the fox follow your teacher?"
DETERMINERS = ("the", "a", "my", "your")
ADJECTIVES = ("small", "big", "red", "old", "quiet", "happy")
NOUNS = ("cat", "dog", "bird", "fox", "child", "teacher", "robot", "river")
INTRANSITIVE = ("sleeps", "runs", "sings", "waits", "falls")
TRANSITIVE = ("sees", "likes", "follows", "finds", "helps")  # every verb drops its "s" after "does"
ADVERBS = ("slowly", "quickly", "today", "again")
CONJUNCTIONS = ("and", "but", "so")
CORPUS_CHARS = 200_000  # about 5000 sentences; the grammar, not the text, is what the model learns
GRAD_PROBE_SIZE = 4096  # elements of the first block's QKV weight gradient kept per step
CLIP_NORM = 1.0


def _noun_phrase(rng: random.Random) -> str:
    words = [rng.choice(DETERMINERS)] + ([rng.choice(ADJECTIVES)] if rng.random() < 0.4 else [])
    return " ".join(words + [rng.choice(NOUNS)])


def _clause(rng: random.Random, question: bool = False) -> str:
    subject = _noun_phrase(rng)
    if rng.random() < 0.5:
        verb, rest = rng.choice(TRANSITIVE), " " + _noun_phrase(rng)
    else:
        verb, rest = rng.choice(INTRANSITIVE), (" " + rng.choice(ADVERBS)) if rng.random() < 0.5 else ""
    if question:
        return f"does {subject} {verb[:-1]}{rest}"
    return f"{subject} {verb}{rest}"


def _sentence(rng: random.Random) -> str:
    if rng.random() < 0.2:
        text = _clause(rng, question=True) + "?"
    else:
        text = _clause(rng)
        if rng.random() < 0.3:
            text += f", {rng.choice(CONJUNCTIONS)} {_clause(rng)}"
        text += "!" if rng.random() < 0.1 else "."
    return text[0].upper() + text[1:]


def corpus(n_chars: int, seed: int = 0) -> str:
    """`n_chars` characters of grammatical sentences, one per line; the same text for the same seed."""
    rng, lines, length = random.Random(seed), [], 0
    while length < n_chars:
        lines.append(_sentence(rng))
        length += len(lines[-1]) + 1
    return "\n".join(lines)[:n_chars]


class Vocab:
    """Characters <-> ids. `VOCAB` below holds every character the grammar can write."""

    def __init__(self, chars: str):
        self.chars = "".join(sorted(set(chars)))
        self.ids = {c: i for i, c in enumerate(self.chars)}

    @property
    def size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        unknown = set(text) - self.ids.keys()
        if unknown:
            raise ValueError(f"characters outside the vocabulary: {sorted(unknown)}")
        return torch.tensor([self.ids[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in torch.as_tensor(ids).reshape(-1).tolist())


_WORDS = DETERMINERS + ADJECTIVES + NOUNS + INTRANSITIVE + TRANSITIVE + ADVERBS + CONJUNCTIONS
VOCAB = Vocab("".join(_WORDS) + "".join(w[0].upper() for w in DETERMINERS + ("does",)) + " ,.!?\n")


@dataclass(frozen=True)
class Config:
    vocab: int
    layers: int
    heads: int
    kv_heads: int  # K and V heads; each serves heads // kv_heads query heads
    width: int
    context: int
    tied: bool = True  # the output head reuses the token embedding

    def __post_init__(self):
        if self.width % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"width ({self.width}) must be a multiple of heads ({self.heads}), and heads a "
                             f"multiple of kv_heads ({self.kv_heads})")

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


# d = 16 on CPU (20 steps with SDPA take ~0.1 s; a kernel in Triton's interpreter is far slower), d = 64 on a GPU
CPU_CONFIG = Config(vocab=VOCAB.size, layers=2, heads=4, kv_heads=2, width=64, context=64)
GPU_CONFIG = Config(vocab=VOCAB.size, layers=4, heads=8, kv_heads=2, width=512, context=512)
CPU_RUN = {"batch": 8, "lr": 3e-3}
GPU_RUN = {"batch": 32, "lr": 1e-3, "warmup": 50, "device": "cuda", "dtype": torch.bfloat16}
GPU_STEPS = 600  # on an H100 with SDPA: ~8 s, loss 3.57 -> ~0.45 (flat from step ~300)


def sdpa_attention(q, k, v):
    """The peer: PyTorch's fused attention (FlashAttention, cuDNN or memory-efficient backend on a GPU)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


class Attention(nn.Module):
    def __init__(self, config: Config, attend):
        super().__init__()
        self.config, self.attend = config, attend
        kv_width = config.kv_heads * config.head_dim
        self.qkv = nn.Linear(config.width, config.width + 2 * kv_width)  # Q, K, V in one GEMM
        self.out = nn.Linear(config.width, config.width)

    def forward(self, x):
        c, (b, t, _) = self.config, x.shape
        q, k, v = self.qkv(x).split([c.width, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim], dim=-1)
        q = q.view(b, t, c.heads, c.head_dim).transpose(1, 2)  # (B, heads, T, d), a strided view
        k, v = (z.view(b, t, c.kv_heads, c.head_dim).transpose(1, 2) for z in (k, v))
        y = self.attend(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, t, c.width))


class Block(nn.Module):
    """Pre-norm: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: Config, attend):
        super().__init__()
        self.attention_norm, self.attention = nn.LayerNorm(config.width), Attention(config, attend)
        self.mlp_norm = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(nn.Linear(config.width, 4 * config.width), nn.GELU(),
                                 nn.Linear(4 * config.width, config.width))

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyGPT(nn.Module):
    """Decoder-only transformer on character ids (B, T) -> logits (B, T, vocab)."""

    def __init__(self, config: Config, attend):
        super().__init__()
        self.config = config
        self.tokens = nn.Embedding(config.vocab, config.width)
        self.positions = nn.Embedding(config.context, config.width)
        self.blocks = nn.ModuleList(Block(config, attend) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab, bias=False)
        self.apply(_init_weights)
        if config.tied:
            self.head.weight = self.tokens.weight

    def forward(self, ids):
        if ids.shape[1] > self.config.context:
            raise ValueError(f"sequence of {ids.shape[1]} tokens is longer than the context ({self.config.context})")
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _init_weights(module):
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


@dataclass
class History:
    """One training run: per step the loss, and with log_grads the global gradient norm (before clipping) and
    a fingerprint of the gradient that attention's backward feeds first (the first block's QKV weight)."""
    model: TinyGPT = field(repr=False)
    loss: list = field(default_factory=list)
    grad_norm: list = field(default_factory=list)
    grad_probe: list = field(default_factory=list, repr=False)
    seconds: float = 0.0


def _batch(data, batch: int, context: int, generator: torch.Generator):
    starts = torch.randint(len(data) - context, (batch,), generator=generator)
    chunk = data[(starts[:, None] + torch.arange(context + 1)).to(data.device)]
    return chunk[:, :-1], chunk[:, 1:]


def _grad_probe(model: TinyGPT) -> np.ndarray:
    grad = model.blocks[0].attention.qkv.weight.grad.flatten()
    step = max(1, grad.numel() // GRAD_PROBE_SIZE)
    return grad[::step][:GRAD_PROBE_SIZE].detach().to("cpu", torch.float64).numpy().copy()


def train(attend, config: Config, steps: int, batch: int, lr: float, seed: int, device="cpu",
          dtype=torch.float32, log_grads: bool = True, warmup: int = 0, text: str | None = None) -> History:
    """AdamW on next-character prediction, the learning rate rising linearly over `warmup` steps. Weights and
    batches come from `seed` alone (own generators; the global RNG is left as it was), so runs that differ only
    in `attend` start equal; on a GPU, atomics in the backward make even reruns differ at rounding level. With
    dtype=torch.bfloat16 the forward runs under autocast (weights and optimiser stay fp32), so `attend`
    receives bf16 q, k, v."""
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float32 or torch.bfloat16 (fp16 needs a loss scaler), got {dtype}")
    data = VOCAB.encode(corpus(CORPUS_CHARS) if text is None else text).to(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyGPT(config, attend)
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95))
    batches = torch.Generator().manual_seed(seed)
    device_type = torch.device(device).type
    history, start = History(model), time.perf_counter()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / max(1, warmup))
        inputs, targets = _batch(data, batch, config.context, batches)
        with torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32):
            logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if log_grads:
            history.grad_probe.append(_grad_probe(model))
        norm = nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        optimizer.step()
        history.loss.append(loss.item())
        if log_grads:
            history.grad_norm.append(norm.item())
    history.seconds = time.perf_counter() - start  # loss.item() waited for the GPU every step
    return history


def compare(attend_a, attend_b, config: Config, steps: int, batch: int, lr: float, seed: int = 0,
            **train_kwargs) -> pd.DataFrame:
    """Two runs from one seed, one row per step: each loss, |Δloss| and ‖g_a − g_b‖ / ‖g_b‖ on the grad probe.
    The histories (with their trained models) are in `frame.attrs["histories"]`."""
    a = train(attend_a, config, steps, batch, lr, seed, log_grads=True, **train_kwargs)
    b = train(attend_b, config, steps, batch, lr, seed, log_grads=True, **train_kwargs)
    grad_diff = [np.linalg.norm(ga - gb) / max(np.linalg.norm(gb), 1e-30)
                 for ga, gb in zip(a.grad_probe, b.grad_probe, strict=True)]
    frame = pd.DataFrame({"loss_a": a.loss, "loss_b": b.loss, "loss_diff": np.abs(np.subtract(a.loss, b.loss)),
                          "grad_norm_a": a.grad_norm, "grad_norm_b": b.grad_norm, "grad_rel_diff": grad_diff})
    frame.index.name = "step"
    frame.attrs["histories"] = (a, b)
    return frame


def plot_losses(runs, labels=("a", "b"), ax=None):
    """The loss curves of `compare`'s frame or of Histories; the second dashed, so equal curves show both."""
    import matplotlib.pyplot as plt
    curves = [runs["loss_a"], runs["loss_b"]] if isinstance(runs, pd.DataFrame) else [h.loss for h in runs]
    if ax is None:
        ax = plt.subplots(figsize=(6, 3.5), layout="constrained")[1]
    for i, (curve, label) in enumerate(zip(curves, labels, strict=True)):
        ax.plot(np.arange(len(curve)), curve, label=label, linestyle="-" if i == 0 else "--")
    ax.axhline(math.log(VOCAB.size), color="grey", linewidth=0.8, linestyle=":", label="uniform guess")
    ax.set(xlabel="step", ylabel="training loss (nats per character)")
    ax.legend()
    ax.grid(alpha=0.3)
    return ax


@torch.no_grad()
def sample(model: TinyGPT, vocab: Vocab, prompt: str, n: int, seed: int = 0, temperature: float = 1.0) -> str:
    """`prompt` followed by `n` generated characters; temperature 0 is greedy. The whole window is recomputed
    for every character (no KV cache: decoding is its own lesson)."""
    device, context = next(model.parameters()).device, model.config.context
    ids, generator = vocab.encode(prompt).to(device)[None], torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    for _ in range(n):
        logits = model(ids[:, -context:])[0, -1].float().cpu()
        if temperature == 0:
            token = logits.argmax().reshape(1)
        else:
            token = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=generator)
        ids = torch.cat([ids, token.to(device)[None]], dim=1)
    model.train(was_training)
    return vocab.decode(ids[0])
