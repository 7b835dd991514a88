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
    # PyTorch: oranges and reds
    "torch.softmax": "tab:orange", "F.layer_norm": "tab:orange", "F.rms_norm": "#fdae6b",
    "torch add + F.rms_norm": "#e6550d", "torch layer_norm backward": "#a63603", "torch rms_norm backward": "#fd8d3c",
    "torch eager": "tab:orange", "eager attention": "tab:orange",
    "SDPA FlashAttention-2": "tab:red", "SDPA cuDNN": "tab:green", "SDPA efficient": "tab:purple",
    "SDPA math": "tab:brown", "FlexAttention": "tab:pink", "cuBLAS": "tab:olive",
    # production libraries: QuACK greens, Liger purples, torch.compile browns
    "quack.softmax": "tab:green", "quack layernorm": "tab:green", "quack rmsnorm": "#74c476",
    "quack add+rmsnorm": "#006d2c", "quack layernorm backward": "#31a354", "quack rmsnorm backward": "#a1d99b",
    "liger softmax": "tab:purple", "liger layernorm": "tab:purple", "liger rmsnorm": "#9e9ac8",
    "liger add+rmsnorm": "#54278f", "liger layernorm backward": "#756bb1", "liger rmsnorm backward": "#bcbddc",
    "FlashAttention-4": "tab:cyan",
    "torch.compile softmax": "tab:brown", "torch.compile layer_norm": "tab:brown", "torch.compile rms_norm": "#d6a77a",
    "torch.compile add+rms_norm": "#6b3d1a", "torch.compile layer_norm backward": "#a0522d",
    "torch.compile rms_norm backward": "#deb887",
    # the course's kernels: blues (softmax week, norms week, attention weeks each told apart)
    "block_softmax": "#9ecae1", "warp_softmax": "#6baed6", "triton_softmax": "tab:blue",
    "online_softmax": "#08519c", "split_softmax": "#4292c6", "log_softmax": "#3182bd",
    "layernorm": "tab:blue", "cuda_layernorm": "#c6dbef", "rmsnorm": "#08519c", "fused_add_rmsnorm": "#6baed6",
    "layernorm_backward": "#3182bd", "rmsnorm_backward": "#9ecae1",
    "qk_scores": "#6baed6", "scale_mask_softmax": "#08519c", "cuda_scale_mask_softmax": "#9ecae1",
    "attention": "tab:blue", "tiled_matmul": "#3182bd",
    "flash_attention": "tab:blue", "flash_attn": "tab:blue", "tiled_attention": "#9ecae1",
    "cuda_flash_attention": "#6baed6", "tc_flash_attention": "#08519c",
    "bias_gelu": "tab:blue", "bias_gelu_backward": "#3182bd", "cuda_bias_gelu": "#c6dbef", "swiglu": "#08519c",
    "swiglu_backward": "#6baed6", "geglu": "#4292c6", "geglu_backward": "#9ecae1", "matmul_bias_gelu": "#2171b5",
    "dropout_residual": "tab:blue", "dropout_residual_backward": "#6baed6", "dropout_residual_layernorm": "#08519c",
    "dropout_residual_layernorm_backward": "#9ecae1", "rope_attention": "#08519c", "alibi_attention": "#6baed6",
    "attention_output_projection": "#3182bd", "qkv_rope_projection": "#4292c6",
}
# A peer of any op, by its library's prefix ("torch.compile bias_gelu none", "liger swiglu"): the library's colour.
FAMILIES = (("torch.compile", "tab:brown"), ("max-autotune", "#6b3d1a"), ("liger", "tab:purple"),
            ("quack", "tab:green"), ("torch ", "tab:orange"), ("cuBLAS", "tab:olive"))
_SPARE = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666",
          "#8dd3c7", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5", "#bc80bd"]


def colour(name: str) -> str:
    """The colour of `name` on every plot of the course; a label that starts with a kernel's name ("triton_softmax
    bf16 4096x1024", "layernorm: fp32") takes that kernel's colour, a peer named by its library's prefix that
    library's colour."""
    if name in FIXED:
        return FIXED[name]
    for head in (name.split(":")[0].strip(), name.split(" ")[0]):
        if head in FIXED:
            return FIXED[head]
    for prefix, family in FAMILIES:
        if name.startswith(prefix):
            return family
    return _SPARE[zlib.crc32(name.encode()) % len(_SPARE)]
