"""Week 39: kernel fusion strategies (bias + activation, dropout + residual (+ norm), RoPE and ALiBi inside attention)."""
