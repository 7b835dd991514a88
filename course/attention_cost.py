"""The attention cost model: FLOPs, HBM bytes and peak memory of each stage of standard attention, and
of FlashAttention's forward pass. One home for weeks 35-37: their benchmarks, roofline plots, graders
and notebooks all count with it (tests/test_attention_cost.py checks it against hand-computed cases).

Shapes: `bh` heads (batch × heads) of M queries and N keys, head dimension d. Bytes are elements times
the bytes of their dtype; every tensor is read or written once per stage (what a kernel that never
re-reads from HBM moves). A multiply-add counts as two FLOPs.
"""
import math


def kept_keys(m: int, n: int, causal: bool = False) -> int:
    """Scores one head's mask keeps: M·N, or with a causal (top-left) mask Σ_i min(i + 1, N)."""
    if not causal:
        return m * n
    k = min(m, n)  # rows 0..k-1 keep i + 1 keys, the rows after them all N
    return k * (k + 1) // 2 + (m - k) * n


def qk_cost(bh: int, m: int, n: int, d: int, element_size: int, score_size: int | None = None) -> dict:
    """S = Q Kᵀ: 2·M·N·d FLOPs per head; reads Q (M·d) and K (N·d), writes S (M·N, score_size bytes each)."""
    score_size = element_size if score_size is None else score_size
    return {"flops": 2 * bh * m * n * d, "bytes": bh * ((m + n) * d * element_size + m * n * score_size)}


def softmax_cost(bh: int, m: int, n: int, element_size: int, causal: bool = False,
                 out_size: int | None = None) -> dict:
    """Fused scale + mask + softmax: reads the kept scores, writes every probability (out_size bytes each);
    about 5 FLOPs per kept score (scale, max, subtract, exponential, sum)."""
    out_size = element_size if out_size is None else out_size
    kept = kept_keys(m, n, causal)
    return {"flops": 5 * bh * kept, "bytes": bh * (kept * element_size + m * n * out_size)}


def pv_cost(bh: int, m: int, n: int, d: int, element_size: int, prob_size: int | None = None) -> dict:
    """O = P V: 2·M·N·d FLOPs per head; reads P (M·N, prob_size bytes each) and V (N·d), writes O (M·d).
    A GEMM library multiplies the zeros of a causal P too, so the mask changes nothing here."""
    prob_size = element_size if prob_size is None else prob_size
    return {"flops": 2 * bh * m * n * d, "bytes": bh * (m * n * prob_size + (n + m) * d * element_size)}


def standard_attention_cost(bh: int, m: int, n: int, d: int, element_size: int, causal: bool = False) -> dict:
    """The three kernels of standard attention with S and P in the inputs' dtype: {stage: {flops, bytes}},
    plus "total"."""
    stages = {"qk": qk_cost(bh, m, n, d, element_size),
              "softmax": softmax_cost(bh, m, n, element_size, causal),
              "pv": pv_cost(bh, m, n, d, element_size)}
    stages["total"] = {key: sum(s[key] for s in stages.values()) for key in ("flops", "bytes")}
    return stages


def attention_flops(bh: int, m: int, n: int, d: int, causal: bool = False) -> int:
    """The FLOPs attention needs: QKᵀ and PV, 4·M·N·d per head; half of it with a causal mask (the usual
    convention for reporting causal TFLOP/s, exact as N grows)."""
    flops = 4 * bh * m * n * d
    return flops // 2 if causal else flops


def flash_attention_cost(bh: int, m: int, n: int, d: int, element_size: int, block_m: int = 128,
                         causal: bool = False) -> dict:
    """FlashAttention's forward: a program per block of block_m queries keeps them on chip and streams K and
    V past them. Reads Q and writes O once, reads K and V once per query block (causal: only the keys up to
    the block's last query), writes the log-sum-exp (float32, one per query). S and P never reach HBM."""
    blocks = math.ceil(m / block_m)
    keys = sum(min(n, (b + 1) * block_m) for b in range(blocks)) if causal else blocks * n
    return {"flops": attention_flops(bh, m, n, d, causal),
            "bytes": bh * ((2 * m * d + 2 * keys * d) * element_size + 4 * m)}


def arithmetic_intensity(cost: dict) -> float:
    """FLOPs per byte of HBM traffic."""
    return cost["flops"] / cost["bytes"]


def standard_peak_bytes(bh: int, m: int, n: int, d: int, element_size: int, square_bytes: int) -> int:
    """Peak memory of standard attention: Q, K, V and O, plus the (M, N) tensors alive at once, square_bytes
    per (query, key) pair: 4 for PyTorch's eager chain in 16 bits (S and P), 4 for week 35's float32 scores
    with P written over them, 2 for 16-bit scores overwritten by P."""
    return bh * ((2 * m + 2 * n) * d * element_size + m * n * square_bytes)


def largest_n(memory_bytes: float, bh: int, d: int, element_size: int, square_bytes: int) -> int:
    """The largest N (= M) whose standard attention peak fits in memory_bytes."""
    a, b = bh * square_bytes, 4 * bh * d * element_size  # peak(N) = a·N² + b·N
    n = int((-b + math.sqrt(b * b + 4 * a * memory_bytes)) / (2 * a))
    while a * (n + 1) ** 2 + b * (n + 1) <= memory_bytes:  # the square root's rounding, either way
        n += 1
    while n > 0 and a * n * n + b * n > memory_bytes:
        n -= 1
    return n
