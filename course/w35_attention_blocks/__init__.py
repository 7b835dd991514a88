"""Week 35, attention building blocks: float64 references and cost model (reference.py), graded tasks
(tasks.py), benchmarks (bench.py). The kernels themselves are the solutions in solutions/w35_attention_blocks.py."""
