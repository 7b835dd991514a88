"""Tests run in-process against the reference solutions and the generated stubs; notebooks are run
by nbval in the same pytest call (see the Makefile's `test` target)."""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")

# Before any test module imports Triton: course.backend decides whether Triton runs in its interpreter, and Triton
# reads that once, when its own library functions (tl.sum, ...) are defined. A test file that imports triton first
# and runs first in a worker would otherwise leave them compiled-only for every later test in that process.
import course.backend  # noqa: E402,F401
