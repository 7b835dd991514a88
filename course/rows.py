"""Argument checks shared by every row-wise kernel launcher (softmax, norms, ...).

A row-wise op works on the last dimension; leading dimensions are flattened into rows.
"""
import torch


def prepare_rows(x: torch.Tensor, out: torch.Tensor | None, op: str):
    """Return (x2d, out2d, out, n_rows, n_cols) for a row-wise op, or raise a clear error.

    `out` is allocated like `x` when it is None. Both must have a contiguous last dimension."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0 or x.shape[-1] == 0 or x.numel() == 0:
        raise ValueError(f"{op}: need at least one row with at least one column, got shape {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError(f"{op}: x must be contiguous (call .contiguous() first); got strides {x.stride()}")
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous():
        raise ValueError(f"{op}: out must be a contiguous {x.dtype} tensor of shape {tuple(x.shape)} "
                         f"on {x.device}; got {out.dtype} {tuple(out.shape)} on {out.device}")
    n_cols = x.shape[-1]
    if x.dim() == 2:  # already (rows, n_cols): a view costs about 1 µs of host time per tensor per call
        return x, out, out, x.shape[0], n_cols
    return x.view(-1, n_cols), out.view(-1, n_cols), out, x.numel() // n_cols, n_cols
