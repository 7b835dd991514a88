"""Argument checks shared by every attention kernel launcher (weeks 35 on).

Attention tensors are (batch, heads, length, head_dim) with any strides; the kernels take the
strides as arguments and only need the last dimension to be contiguous.
"""
import torch

from .backend import DEVICE


def on_device(t: torch.Tensor, op: str, name: str) -> None:
    """Triton on a GPU needs CUDA tensors, its CPU interpreter CPU ones: say so instead of failing in the launch."""
    if t.device.type != DEVICE:
        raise ValueError(f"{op}: {name} is on {t.device}, but this machine's kernels run on {DEVICE}: create it "
                         f"with device=course.DEVICE (or move it with .to(course.DEVICE))")


def as_heads(t, op: str, name: str) -> torch.Tensor:
    """`t` as a (B, H, N, d) tensor with a contiguous last dimension (a copy only when it is not)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    on_device(t, op, name)
    if t.dim() != 4 or t.numel() == 0:
        raise ValueError(f"{op}: {name} must have shape (batch, heads, length, head_dim) with no empty "
                         f"dimension; got {tuple(t.shape)}")
    return t if t.stride(-1) == 1 else t.contiguous()


def out_tensor(out, shape: tuple, like: torch.Tensor, op: str, dtypes: tuple = (), rows: bool = False):
    """`out`, checked, or a new contiguous tensor of `shape` in `like`'s dtype. `out` may have `like`'s
    dtype or one of `dtypes`; it must be contiguous, or with `rows`, rows at one stride (a (B, H, M, N)
    view whose rows b, h, i lie `stride(2)` elements apart, like the front of each row of a wider buffer)."""
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    if tuple(out.shape) != tuple(shape) or out.dtype not in (like.dtype, *dtypes) or out.device != like.device \
            or not (out.is_contiguous() or rows and rows_at_one_stride(out)):
        raise ValueError(f"{op}: out must be a contiguous {like.dtype} tensor of shape {tuple(shape)} on "
                         f"{like.device}; got {out.dtype} {tuple(out.shape)} on {out.device}")
    return out


def key_lengths_tensor(key_lengths, batch: int, like: torch.Tensor, op: str):
    """int32 (B,) lengths on `like`'s device, or None."""
    if key_lengths is None:
        return None
    lengths = torch.as_tensor(key_lengths, device=like.device).reshape(-1)
    if lengths.numel() != batch or lengths.is_floating_point() or (lengths < 0).any():
        raise ValueError(f"{op}: key_lengths must hold {batch} non-negative integers (one per batch entry); "
                         f"got {tuple(lengths.shape)} {lengths.dtype}")
    return lengths.to(torch.int32)


def slopes_tensor(alibi_slopes, heads: int, like: torch.Tensor, op: str):
    """float32 (H,) ALiBi slopes on `like`'s device, or None."""
    if alibi_slopes is None:
        return None
    slopes = torch.as_tensor(alibi_slopes, device=like.device).reshape(-1)
    if slopes.numel() != heads:
        raise ValueError(f"{op}: alibi_slopes must hold {heads} values (one per head); got {slopes.numel()}")
    return slopes.to(torch.float32)


def rows_at_one_stride(t: torch.Tensor) -> bool:
    """True for a (B, H, M, N) tensor whose rows (b, h, i) lie t.stride(2) elements apart, each row
    contiguous: a contiguous tensor, or the front N columns of every row of a wider contiguous one."""
    if t.dim() != 4 or t.stride(3) != 1 or t.stride(2) < t.shape[3]:
        return False
    return t.stride()[:2] == (t.shape[1] * t.shape[2] * t.stride(2), t.shape[2] * t.stride(2))
