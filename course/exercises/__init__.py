"""The learner's exercise files, one per week, generated from solutions/ (see course/stubs.py)."""
