"""Week 33, softmax: float64 references and cost model (reference.py), graded tasks (tasks.py),
benchmarks (bench.py). The kernels themselves are the solutions in solutions/w33_softmax.py."""
