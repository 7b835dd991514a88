"""Tests run in-process against the reference solutions and the generated stubs; notebooks are run
by nbval in the same pytest call (see the Makefile's `test` target)."""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")
