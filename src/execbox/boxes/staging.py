"""Read-only copies that boxes mount from the host: the agent package and execbox's own pip.

Each copy is staged once per content (the agent: a hash of its sources; pip: its version) under
the jail dir, published atomically, and never changed afterwards, so a running box keeps what
it started with while an upgrade stages a new copy. Runtime templates live in runtime.py.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile

from ..agent import SHIPPED_SUFFIXES
from . import staged_leases
from .box import agent_source_dir
from .runtime import AGENT_PACKAGE, STAGE_FORMAT, SYSTEM_PYTHON, jail_dir


def staged_agent() -> str:
    """A read-only copy of the agent package as ``<dir>/execbox_agent``; returns ``<dir>``.

    Keyed by a hash of the sources, so an upgrade stages a new copy and a running box keeps
    the one it started with. Boxes mount ``<dir>`` at /opt/execbox, never the source tree.
    """
    src = agent_source_dir()
    files = sorted(f for f in os.listdir(src) if f.endswith(SHIPPED_SUFFIXES))
    h = hashlib.sha256(STAGE_FORMAT)
    for fn in files:
        h.update(fn.encode())
        with open(os.path.join(src, fn), "rb") as f:
            h.update(f.read())
    root = os.path.join(jail_dir(), "agent", h.hexdigest()[:16])
    target = os.path.join(root, AGENT_PACKAGE)
    os.makedirs(os.path.dirname(root), mode=0o755, exist_ok=True)
    staged_leases.hold(root)  # boxes of this process mount it: no sweep may remove it now
    if os.path.isfile(os.path.join(target, ".complete")):
        return root
    tmp = tempfile.mkdtemp(prefix=".agent-", dir=os.path.dirname(root))
    os.chmod(tmp, 0o755)
    pkg = os.path.join(tmp, AGENT_PACKAGE)
    os.mkdir(pkg, 0o755)
    for fn in files:
        shutil.copyfile(os.path.join(src, fn), os.path.join(pkg, fn))
        os.chmod(os.path.join(pkg, fn), 0o644)
    compile_agent(pkg)
    open(os.path.join(pkg, ".complete"), "w").close()
    return _publish(tmp, root)


def _publish(tmp: str, root: str) -> str:
    """Move a fully staged ``tmp`` to ``root`` (atomic; a concurrent stager may have won) and make
    the path to it traversable for box uids."""
    try:
        os.rename(tmp, root)
    except OSError:  # another process staged it first
        shutil.rmtree(tmp, ignore_errors=True)
    for d in (jail_dir(), os.path.dirname(root)):
        make_traversable(d)
    return root


def staged_pip() -> str | None:
    """A read-only copy of execbox's own pip (pure Python, vendors its dependencies) as
    ``<dir>/pip``; returns ``<dir>``, or None when pip is not installed. Boxes with network mount
    it at PIP_MOUNT so in-session installs work on any image that has python3."""
    import importlib.util

    spec = importlib.util.find_spec("pip")
    if spec is None or not spec.origin:
        return None
    src = os.path.dirname(spec.origin)
    with open(os.path.join(src, "__init__.py"), encoding="utf-8") as f:
        version = (re.search(r'__version__ = "([^"]+)"', f.read()) or [None, "unknown"])[1]
    root = os.path.join(jail_dir(), "pip", re.sub(r"[^A-Za-z0-9.]", "_", version))
    if os.path.isfile(os.path.join(root, ".complete")):
        return root
    os.makedirs(os.path.dirname(root), mode=0o755, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".pip-", dir=os.path.dirname(root))
    os.chmod(tmp, 0o755)
    shutil.copytree(src, os.path.join(tmp, "pip"), ignore=shutil.ignore_patterns("__pycache__"))
    for dirpath, dirnames, filenames in os.walk(tmp):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o755)
        for fn in filenames:
            os.chmod(os.path.join(dirpath, fn), 0o644)
    open(os.path.join(tmp, ".complete"), "w").close()
    return _publish(tmp, root)


def compile_agent(pkg: str, python: str = SYSTEM_PYTHON) -> None:
    """Write the staged agent's bytecode (``__pycache__``) for the box interpreter.

    A box mounts the agent read-only and runs with PYTHONDONTWRITEBYTECODE, so without it every
    box start recompiles every agent module from source (~40 ms of CPU per box). The sources
    never change under a staged copy (its directory is keyed by their hash), so the .pyc files
    are "unchecked-hash": the box loads them without even a stat of the source. Compiled here
    in-process when this interpreter has the box's major.minor (same bytecode magic), else by
    the box interpreter itself. A failure only costs speed: the box compiles in memory as before.
    """
    import compileall
    import py_compile

    here = f"python{sys.version_info.major}.{sys.version_info.minor}"
    try:
        same = os.path.basename(os.path.realpath(python)) == here
        if same:
            ok = compileall.compile_dir(pkg, quiet=1, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        else:
            ok = subprocess.run(  # noqa: S603 - fixed argv, no user input
                [python, "-I", "-m", "compileall", "-q", "--invalidation-mode", "unchecked-hash", pkg],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    cache = os.path.join(pkg, "__pycache__")
    if os.path.isdir(cache):
        os.chmod(cache, 0o755)
        for fn in os.listdir(cache):
            os.chmod(os.path.join(cache, fn), 0o644)
    if not ok:
        logging.getLogger("execbox.jail").warning("agent bytecode not compiled for %s: boxes start slower", python)


def make_traversable(path: str) -> None:
    try:
        st = os.stat(path)
        if st.st_mode & 0o005 != 0o005:
            os.chmod(path, st.st_mode | 0o005)
    except OSError:
        pass

