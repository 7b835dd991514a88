"""Week 36, standard multi-head attention analysed: graded tasks (tasks.py) and benchmarks (bench.py). The
cost model is course/attention_cost.py; the solutions are in solutions/w36_mha_analysis.py."""
