"""Run a notebook's code cells in order without Jupyter (the lent GPU image has no jupyter or nbval):
python3 tools/nb_exec.py notebooks/w34_layernorm/d6_fused_add_rmsnorm.ipynb [--solutions]
IPython magics (lines starting with % or !) are skipped, `display` prints, and where IPython is missing a
stand-in `IPython.display` (Code, Markdown, HTML, display) prints the text. Stops at the first failing cell
and exits 1 with its index; prints each cell's index and wall time."""
import json
import linecache
import os
import sys
import time


def _stand_in_ipython() -> None:
    try:
        import IPython.display  # noqa: F401
    except ImportError:
        import types
        display_module = types.ModuleType("IPython.display")
        display_module.display = lambda *objects, **_: [print(o) for o in objects]
        for name in ("Code", "Markdown", "HTML"):
            setattr(display_module, name, lambda data="", *args, **kwargs: data)
        sys.modules["IPython"] = types.ModuleType("IPython")
        sys.modules["IPython"].display = display_module
        sys.modules["IPython"].get_ipython = lambda: None
        sys.modules["IPython"].version_info = (9, 0)  # matplotlib looks
        sys.modules["IPython.display"] = display_module


def main(path: str) -> int:
    _stand_in_ipython()
    if "--solutions" in sys.argv:
        os.environ["COURSE_SOLUTIONS"] = "1"
    cells = [c for c in json.load(open(path))["cells"] if c["cell_type"] == "code"]
    scope = {"__name__": "__main__", "display": print}
    for index, cell in enumerate(cells):
        source = "".join(line for line in cell["source"] if not line.lstrip().startswith(("%", "!")))
        start = time.time()
        name = f"<{path} code cell {index}>"
        # as IPython does: the cell's text in linecache, so inspect.getsource (Triton's @jit) finds a kernel
        # defined in a cell
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        try:
            exec(compile(source, name, "exec"), scope)
        except Exception as exc:
            print(f"--- code cell {index} FAILED: {type(exc).__name__}: {exc}")
            raise
        print(f"--- code cell {index} ok ({time.time() - start:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
