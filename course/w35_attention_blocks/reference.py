"""Float64 NumPy references for week 35 (what the grader trusts) and the cost model of its kernels.

Shapes: q (B, H, M, d), k and v (B, H, N, d), any strides. Masks, one convention throughout:
- causal is aligned top-left, like SDPA's is_causal: query i sees keys j <= i;
- key padding: key_lengths[b] keys of batch b are real, keys j >= key_lengths[b] are masked;
- ALiBi adds -slope_h * |i - j| to the scaled score (Press et al., 2022, "Train Short, Test Long");
- a row whose every key is masked has probabilities 0 and output 0, never NaN.
"""
import numpy as np

# The cost model of the week's kernels has one home, course/attention_cost.py; reachable from here as before.
from ..attention_cost import attention_flops, qk_cost, softmax_cost  # noqa: F401


def attention_scores(q, k, scale=None):
    """scale · q kᵀ over the last two axes; scale defaults to 1/sqrt(d)."""
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    return scale * (q @ np.swapaxes(k, -1, -2))


def alibi_slopes(n_heads: int) -> np.ndarray:
    """The paper's slopes for a power-of-two head count: 2^(-8h/H), h = 1..H."""
    return 2.0 ** (-8.0 * np.arange(1, n_heads + 1) / n_heads)


def keep_mask(m: int, n: int, batch: int = 1, key_lengths=None, causal: bool = False) -> np.ndarray:
    """Boolean (B, 1, M, N): True where query i may attend to key j."""
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    keep = np.broadcast_to(np.ones((m, n), bool), (batch, 1, m, n))
    if causal:
        keep = keep & (j <= i)
    if key_lengths is not None:
        keep = keep & (j < np.asarray(key_lengths).reshape(-1, 1, 1, 1))
    return keep


def alibi_bias(m: int, n: int, slopes) -> np.ndarray:
    """(1, H, M, N) additive bias -slope_h · |i - j|."""
    distance = np.abs(np.arange(m)[:, None] - np.arange(n)[None, :])
    return -np.asarray(slopes, dtype=np.float64).reshape(1, -1, 1, 1) * distance


def masked_scores(scores, key_lengths=None, causal=False, alibi_slopes=None):
    """Scores plus the ALiBi bias, -inf wherever the masks drop a key."""
    b, _, m, n = scores.shape
    if alibi_slopes is not None:
        scores = scores + alibi_bias(m, n, alibi_slopes)
    return np.where(keep_mask(m, n, b, key_lengths, causal), scores, -np.inf)


def softmax_rows(x):
    """Softmax over the last axis; a row of -inf only gives zeros."""
    top = x.max(axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1.0, total)


def log_sum_exp(q, k, causal=False, scale=None):
    """(B, H, M): the natural log of each row's Σ_j exp(s_ij) over its kept keys, s = scale · q kᵀ (what a
    FlashAttention forward saves beside o, weeks 37 and 38); -inf for a row with no key."""
    s = masked_scores(attention_scores(q, k, scale), causal=causal)
    top = s.max(axis=-1, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return (safe + np.log(np.exp(s - safe).sum(axis=-1, keepdims=True)))[..., 0]


def scale_mask_softmax(scores, scale, key_lengths=None, causal=False, alibi_slopes=None):
    return (softmax_rows(masked_scores(scale * scores, key_lengths, causal, alibi_slopes)),)


def attention(q, k, v, key_lengths=None, causal=False, alibi_slopes=None, scale=None):
    """Standard attention: softmax(mask(scale · q kᵀ + bias)) v."""
    p = softmax_rows(masked_scores(attention_scores(q, k, scale), key_lengths, causal, alibi_slopes))
    return p @ v


def attention_scale(q, k, v, key_lengths=None, causal=False, alibi_slopes=None, scale=None):
    """The size of the terms each output element sums: Σ_j p_ij |v_jc| (grading scale)."""
    p = softmax_rows(masked_scores(attention_scores(q, k, scale), key_lengths, causal, alibi_slopes))
    return p @ np.abs(v)


def rope_tables(n: int, d: int, base: float = 10000.0):
    """cos and sin of the rotary angles, (N, d/2): position t, frequency base^(-2i/d) (Su et al., 2021)."""
    angles = np.arange(n)[:, None] * base ** (-2.0 * np.arange(d // 2) / d)[None, :]
    return np.cos(angles), np.sin(angles)


def rope(x, cos, sin):
    """Rotate the pairs (x_c, x_{c+d/2}) of every position by its angle: the "rotate half" layout of
    GPT-NeoX and Llama. cos, sin: (N, d/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return (np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1),)


