"""A template build never runs its packages' code on the host (runtime_build.py).

pip and npm do not run on the host at all: they run in a jail box with the version being built
mounted read-write where boxes see it and the index hosts as its only network, and a dependency
that is not a package from the index is refused (build_box.py). Within that box, and for the
steps that stay on the host, two steps need the new version's own interpreter:

* pip installs into the version's venv, so pip must run as that venv's interpreter (pip's own
  ``--python`` re-runs pip there). Started normally it would process the ``.pth`` files and
  ``sitecustomize`` that packages put in site-packages (a ``--from`` parent's, or any package
  a previous step installed); and the venv's ``bin/python`` itself is a file a wheel can
  replace (``*.data/scripts/python``), as is ``pyvenv.cfg`` (``*.data/data``).
  :func:`pip_argv` therefore runs the build's own trusted interpreter (never a file of the
  template) with ``-I -S``: no site processing at all, ``sys.prefix`` set to the venv by hand,
  its site-packages appended after the standard library for pip to read as metadata, and any
  top-level import that only site-packages could satisfy refused. :func:`reset_interpreter`
  (on the host, after the box) puts the venv's interpreter links and ``pyvenv.cfg`` back, so
  what boxes start is the trusted interpreter too.
* matplotlib's font list is made by importing matplotlib, which is package code by definition.
  :func:`font_lists_in_box` runs it in a jail box: the version read-only at the path boxes use,
  no network, the box's uid, seccomp and limits. Only the lists' text comes back, checked here.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
from typing import Any

log = logging.getLogger(__name__)

_BOOT = r"""
import sys
sys.prefix = sys.exec_prefix = sys.argv[1]  # what site.venv() sets; -S skipped site with its .pth files
import runpy, sysconfig  # after: sysconfig reads sys.prefix when imported
from importlib.machinery import PathFinder
stdlib = list(sys.path)
site = list(dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib")))
if not all(p.startswith(sys.prefix + "/") for p in site):
    sys.exit(f"execbox: site-packages {site} is not inside the venv {sys.prefix}")
sys.path.extend(site)


class StdlibOnly:
    # the venv's packages are metadata to pip: a top-level import only they could satisfy is refused
    @staticmethod
    def find_spec(name, path=None, target=None):
        if path is None and name != "pip" and PathFinder.find_spec(name, stdlib) is None:
            raise ModuleNotFoundError(f"No module named {name!r} (not imported from the template being built)",
                                      name=name)
        return None


sys.meta_path.insert(sys.meta_path.index(PathFinder), StdlibOnly)  # after builtins, frozen
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def pip_runner() -> str:
    """execbox's own pip as a script another interpreter can run (what ``pip --python`` uses)."""
    import pip

    return os.path.join(os.path.dirname(os.path.abspath(pip.__file__)), "__pip-runner__.py")


def pip_argv(venv: str, args: list[str], python: str, runner: str | None = None) -> list[str]:
    """Run execbox's pip with ``args`` for ``venv`` under the trusted ``python`` (the interpreter
    the venv was made from), without site processing. ``runner``: the script that starts pip
    (default execbox's ``__pip-runner__.py``; a build box passes its guard, build_box.py)."""
    return [python, "-I", "-S", "-c", _BOOT, venv, runner or pip_runner(), "--keyring-provider", "disabled", *args]


def reset_interpreter(venv: str, python: str) -> None:
    """Make ``venv``'s ``bin/python*`` and ``pyvenv.cfg`` those of a fresh venv of ``python``,
    whatever a package (or a ``--from`` parent's packages) put there."""
    import shutil
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="execbox-venv-") as tmp:
        fresh = os.path.join(tmp, "v")
        subprocess.run([python, "-m", "venv", "--without-pip", fresh], check=True,  # noqa: S603
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        bin_dir = os.path.join(venv, "bin")
        os.makedirs(bin_dir, exist_ok=True)
        for name in os.listdir(bin_dir):  # anything named like an interpreter: only the fresh ones stay
            if re.fullmatch(r"python[0-9.]*", name):
                _remove(os.path.join(bin_dir, name))
        for name in os.listdir(os.path.join(fresh, "bin")):
            if re.fullmatch(r"python[0-9.]*", name):
                shutil.copy2(os.path.join(fresh, "bin", name), os.path.join(bin_dir, name), follow_symlinks=False)
        _remove(os.path.join(venv, "pyvenv.cfg"))
        shutil.copy2(os.path.join(fresh, "pyvenv.cfg"), os.path.join(venv, "pyvenv.cfg"))


def _remove(path: str) -> None:
    import shutil

    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


FONT_PROGRAM = r"""
import importlib.util, os

def main():
    if importlib.util.find_spec("matplotlib") is None:
        return None
    seed = "/tmp/execbox-mpl-seed"
    os.makedirs(seed, exist_ok=True)
    os.environ["MPLCONFIGDIR"] = seed
    import matplotlib.font_manager  # noqa: F401 - writes the font list into MPLCONFIGDIR
    return {n: open(os.path.join(seed, n), encoding="utf-8").read() for n in os.listdir(seed)
            if n.startswith("fontlist-") and n.endswith(".json")}
"""
_FONT_LIST = re.compile(r"fontlist-[A-Za-z0-9._-]{1,60}\.json")
MAX_FONT_BYTES = 64 * 1024 * 1024


def has_matplotlib(venv: str) -> bool:
    """Whether ``venv`` holds matplotlib (a look at its files; nothing of it runs)."""
    return bool(glob.glob(os.path.join(glob.escape(venv), "lib", "python3*", "site-packages", "matplotlib",
                                       "__init__.py")))


class NoBox(Exception):
    """No jail box can start on this host (no bwrap, no user namespaces...): the step is skipped."""


def font_lists_in_box(venv: str, timeout: float = 300.0) -> dict[str, str]:
    """``{fontlist-*.json: text}`` made by ``venv``'s matplotlib inside a jail box.

    Raises NoBox when no box can start, RuntimeNotUsable when the program failed in the box.
    """
    from . import cgroups, jail_box, staging
    from . import runtime as rt
    from .bwrap import bwrap_path

    if bwrap_path() is None:
        raise NoBox("bubblewrap is not installed")
    try:
        cgroups.detect()
        use_cgroups = True
    except cgroups.CgroupUnavailable:
        use_cgroups = False
    settings = jail_box.JailSettings(
        runtime=rt.Runtime("build", f"{rt.RUNTIME_MOUNT}/bin/python", venv), memory_bytes=1 << 30, cpus=1.0,
        pids=64, disk_bytes=64 << 20, tmp_bytes=256 << 20, preload="none", use_cgroups=use_cgroups,
        agent_root=staging.staged_agent(), egress=None)  # egress None: the box has no network at all
    try:
        box = jail_box.start(settings, None, tmpfs_workspace=True, oneshot=True)
    except Exception as e:  # noqa: BLE001 - any reason a box cannot start here
        raise NoBox(str(e)[:300]) from e
    try:
        reply = box.client.call("exec", {"language": "python", "code": FONT_PROGRAM, "arguments": {},
                                         "context_id": None, "timeout": timeout, "output_cap": 65536,
                                         "stream": False}, timeout=timeout + 10)
    finally:
        box.destroy()
        jail_box.drain(30.0)  # its teardown (uid, cgroup, box dir) before the CLI exits
    return _font_lists(reply)


def _font_lists(reply: dict[str, Any]) -> dict[str, str]:
    """The box's answer, checked: only ``fontlist-*.json`` names, JSON text, bounded in size."""
    from .runtime import RuntimeNotUsable

    result = reply.get("result") or {}
    if reply.get("exit_code") != 0 or not result.get("present"):
        raise RuntimeNotUsable(f"building matplotlib's font cache failed: {str(reply.get('stderr', ''))[-1500:]}")
    lists = json.loads(result.get("json") or "null")
    if lists is None:
        return {}
    if not isinstance(lists, dict) or sum(len(str(v)) for v in lists.values()) > MAX_FONT_BYTES:
        raise RuntimeNotUsable("building matplotlib's font cache failed: the box returned something else")
    out: dict[str, str] = {}
    for name, text in lists.items():
        if isinstance(name, str) and _FONT_LIST.fullmatch(name) and isinstance(text, str):
            try:
                json.loads(text)  # a list matplotlib can read back
            except ValueError:
                raise RuntimeNotUsable(f"building matplotlib's font cache failed: {name} is not JSON") from None
            out[name] = text
    return out
