"""One colour per kernel across the whole course: a plot colours a series by its kernel's name, never by its
position, so `torch.softmax` or "SDPA FlashAttention-2" looks the same on every page and a legend cannot name
the wrong line.

Owns: `colour(name)`. The named kernels below have fixed colours; the course's own kernels are blues, the
production peers warm colours, ceilings black/grey. Any other name gets a stable colour of its own (from a hash
of the name, not from the order it is plotted in).
"""
import zlib

FIXED = {
    # ceilings and references
    "copy": "black", "ceiling": "black", "NumPy": "tab:gray", "numpy": "tab:gray",
    # PyTorch
    "torch.softmax": "tab:orange", "F.layer_norm": "tab:orange", "F.rms_norm": "tab:orange",
    "torch eager": "tab:orange", "eager attention": "tab:orange", "torch add + F.rms_norm": "tab:orange",
    "torch layer_norm backward": "tab:orange", "torch rms_norm backward": "tab:orange",
    "SDPA FlashAttention-2": "tab:red", "SDPA cuDNN": "tab:green", "SDPA efficient": "tab:purple",
    "SDPA math": "tab:brown", "FlexAttention": "tab:pink", "cuBLAS": "tab:olive",
    # production libraries
    "quack.softmax": "tab:green", "quack layernorm": "tab:green", "quack rmsnorm": "tab:green",
    "quack add+rmsnorm": "tab:green", "liger softmax": "tab:purple", "liger layernorm": "tab:purple",
    "liger rmsnorm": "tab:purple", "liger add+rmsnorm": "tab:purple", "FlashAttention-4": "tab:cyan",
    "torch.compile softmax": "tab:brown", "torch.compile layer_norm": "tab:brown",
    "torch.compile rms_norm": "tab:brown", "torch.compile add+rms_norm": "tab:brown",
    # the course's kernels
    "block_softmax": "#9ecae1", "warp_softmax": "#6baed6", "triton_softmax": "tab:blue",
    "online_softmax": "#08519c", "log_softmax": "#3182bd", "layernorm": "tab:blue", "cuda_layernorm": "#9ecae1",
    "rmsnorm": "#08519c", "fused_add_rmsnorm": "tab:blue", "layernorm_backward": "tab:blue",
    "rmsnorm_backward": "#08519c", "flash_attention": "tab:blue", "flash_attn": "tab:blue",
    "tiled_attention": "#9ecae1", "cuda_flash_attention": "#6baed6", "tc_flash_attention": "#08519c",
}
_SPARE = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666",
          "#8dd3c7", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5", "#bc80bd"]


def colour(name: str) -> str:
    """The colour of `name` on every plot of the course."""
    if name in FIXED:
        return FIXED[name]
    return _SPARE[zlib.crc32(name.encode()) % len(_SPARE)]
