"""Week 37, FlashAttention core: float64 references (reference.py) and graded tasks (tasks.py). The kernels
are the solutions in solutions/w37_flash_attention_core.py; the cost model is course/attention_cost.py."""
