"""environment.yml (conda route) and requirements.txt (what `make` installs) name the same packages."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONDA_NAMES = {"pytorch": "torch"}  # conda name -> pip name
REQUIRED = {"jupyterlab", "torch", "triton", "cupy-cuda13x", "matplotlib", "nbval", "pandas"}


def pip_requirements() -> dict:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    return pins


def conda_requirements() -> dict:
    pins = {}
    for line in (ROOT / "environment.yml").read_text().splitlines():
        match = re.match(r"^\s+- ([A-Za-z0-9_.-]+)(==|=)([0-9][^\s#]*)\s*$", line)
        if match:
            name = match.group(1).lower()
            pins[CONDA_NAMES.get(name, name)] = match.group(3)
    return pins


def test_both_routes_install_the_same_pinned_packages():
    conda = {k: v for k, v in conda_requirements().items() if k != "python"}
    assert conda == pip_requirements()


def test_the_course_packages_are_named():
    assert REQUIRED <= set(pip_requirements())


def test_environment_installs_the_course_package_and_the_cpu_torch_pin():
    assert "- -e ." in (ROOT / "environment.yml").read_text()
    assert pip_requirements()["torch"] == "2.13.0"
