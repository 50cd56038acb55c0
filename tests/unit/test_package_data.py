"""A wheel holds every file the package opens by path: a non-editable install without
agent/js_runner.js failed every JavaScript run. setuptools expands ``package-data`` globs
relative to the package directory, as ``Path.glob`` does here."""

import subprocess
import tomllib
from pathlib import Path

import execbox

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(execbox.__file__).resolve().parent
REFERENCE_ONLY = {".proto"}  # envd's protos: the generated modules are what runs


def test_every_non_python_file_of_the_package_is_package_data() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["execbox"]
    shipped = {p.resolve() for pattern in globs for p in PACKAGE.glob(pattern) if p.is_file()}
    tracked = subprocess.run(["git", "ls-files", "-z", "--", str(PACKAGE)], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    needed = [ROOT / f for f in tracked if f and not f.endswith(".py") and Path(f).suffix not in REFERENCE_ONLY]
    assert any(p.name == "js_runner.js" for p in needed)  # the check sees the agent's files
    missing = [str(p.relative_to(ROOT)) for p in needed if p.resolve() not in shipped]
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
