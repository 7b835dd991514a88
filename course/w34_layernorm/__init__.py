"""Week 34, LayerNorm and RMSNorm: float64 references and cost model (reference.py), graded tasks
(tasks.py), benchmarks (bench.py). The kernels themselves are the solutions in solutions/w34_layernorm.py."""
