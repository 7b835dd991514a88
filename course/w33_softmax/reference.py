"""Float64 NumPy references for week 33 (what the grader trusts) and the softmax cost model."""
import numpy as np


def softmax_state(x: np.ndarray):
    """(m, l) of each row: its max and sum(exp(x - m)); an all -inf row gives (-inf, 0)."""
    m = x.max(axis=-1)
    finite = np.isfinite(m)
    l = np.zeros_like(m)
    l[finite] = np.exp(x[finite] - m[finite][..., None]).sum(axis=-1)
    return m, l


def merge_states(m_a, l_a, m_b, l_b):
    m = np.maximum(m_a, m_b)
    l = np.zeros_like(m)
    live = np.isfinite(m)
    l[live] = l_a[live] * np.exp(m_a[live] - m[live]) + l_b[live] * np.exp(m_b[live] - m[live])
    return m, l


def softmax(x: np.ndarray) -> np.ndarray:
    m, l = softmax_state(x)
    return np.exp(x - m[..., None]) / l[..., None]


def log_softmax(x: np.ndarray) -> np.ndarray:
    m, l = softmax_state(x)
    return x - m[..., None] - np.log(l)[..., None]


def softmax_cost(n_rows: int, n_cols: int, element_size: int) -> dict:
    """Fewest HBM bytes (read x once, write y once) and FLOPs (max, subtract, exp, sum, scale)."""
    elements = n_rows * n_cols
    return {"bytes": 2 * elements * element_size, "flops": 5 * elements}
