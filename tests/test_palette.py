"""course.palette: a kernel's colour comes from its name, the same on every plot of the course."""
from course.palette import FIXED, colour


def test_named_kernels_keep_their_colour_and_others_get_a_stable_one():
    assert colour("SDPA FlashAttention-2") == FIXED["SDPA FlashAttention-2"]
    assert colour("a kernel nobody named") == colour("a kernel nobody named")
    assert colour("torch.softmax") != colour("triton_softmax")


def test_the_colour_does_not_depend_on_what_else_is_plotted():
    alone = colour("FlexAttention")
    [colour(name) for name in ("x", "y", "z")]
    assert colour("FlexAttention") == alone


def test_kernels_drawn_side_by_side_are_told_apart():
    for together in (("F.layer_norm", "F.rms_norm", "torch layer_norm backward", "torch rms_norm backward"),
                     ("layernorm", "rmsnorm", "layernorm_backward", "rmsnorm_backward", "fused_add_rmsnorm",
                      "cuda_layernorm"),
                     ("quack rmsnorm", "liger rmsnorm", "torch.compile rms_norm", "rmsnorm", "F.rms_norm")):
        assert len({colour(k) for k in together}) == len(together), together


def test_a_label_that_starts_with_a_kernel_takes_its_colour():
    assert colour("triton_softmax bf16 4096x1024") == colour("triton_softmax")


def test_the_peers_of_an_op_take_their_librarys_colour():
    together = ("dropout_residual", "torch dropout_residual", "torch.compile dropout_residual",
                "max-autotune dropout_residual", "liger swiglu")
    assert len({colour(k) for k in together}) == len(together)
    assert colour("torch.compile bias_gelu none") == colour("torch.compile swiglu") == FIXED["torch.compile softmax"]
