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
