"""Reference solutions, one module per week, with the learner's parts between BEGIN/END SOLUTION markers."""
