"""Sandbox runtimes: the Python a box runs, kept apart from execbox's own installation.

A box never sees execbox's virtualenv, source tree, data dir or the host's home. It runs
either the host's Debian interpreter with its standard library (runtime ``system``, the
default) or a named runtime: a venv built from that same interpreter under
``<jail dir>/runtimes/<name>`` and mounted read-only at ``/opt/execbox/runtime``. The agent
package is copied (not bind-mounted from the source tree) into ``<jail dir>/agent/<hash>``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .box import agent_source_dir

SYSTEM_PYTHON = "/usr/bin/python3"
SYSTEM = "system"
RUNTIME_MOUNT = "/opt/execbox/runtime"
AGENT_ROOT_IN_BOX = "/opt/execbox"
AGENT_PACKAGE = "execbox_agent"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
MANIFEST = "execbox-runtime.json"
STAGE_FORMAT = b"execbox-agent-stage-2"  # bump when the staged layout changes (2: with bytecode)


def jail_dir() -> str:
    """EXECBOX_JAIL_DIR, else /var/lib/execbox (root) or ~/.cache/execbox (others)."""
    env = os.environ.get("EXECBOX_JAIL_DIR", "").strip()
    if env:
        return os.path.abspath(env)
    if os.geteuid() == 0:
        return "/var/lib/execbox"
    return os.path.join(os.path.expanduser("~"), ".cache", "execbox")


def runtimes_dir() -> str:
    return os.path.join(jail_dir(), "runtimes")


@dataclass
class Runtime:
    """What a box mounts and runs for Python."""

    name: str
    python: str  # the interpreter path inside the box
    host_dir: str | None = None  # venv directory on the host (None: the system interpreter)
    packages: list[str] = field(default_factory=list)

    def mounts(self) -> list[tuple[str, str]]:
        return [(self.host_dir, RUNTIME_MOUNT)] if self.host_dir else []


class RuntimeNotUsable(ValueError):
    """An unknown or broken runtime name (the provider turns it into SB002)."""


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise RuntimeNotUsable(f"runtime name {name!r} is invalid: use lowercase letters, digits, '.', '_', '-'")
    return name


def system_runtime() -> Runtime:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        raise RuntimeNotUsable(f"{SYSTEM_PYTHON} is missing: the system runtime needs the host's python3")
    return Runtime(SYSTEM, SYSTEM_PYTHON)


def list_runtimes() -> list[dict[str, object]]:
    out: list[dict[str, object]] = [{"name": SYSTEM, "python": SYSTEM_PYTHON, "packages": [], "path": None}]
    root = runtimes_dir()
    if os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            manifest = os.path.join(root, name, MANIFEST)
            if os.path.isfile(manifest):
                with open(manifest, encoding="utf-8") as f:
                    info = json.load(f)
                out.append({"name": name, "python": info.get("python"), "packages": info.get("packages", []),
                            "path": os.path.join(root, name), "installed_at": info.get("installed_at")})
    return out


def resolve(name: str | None) -> Runtime:
    """The runtime a config names ('' or 'system' = host interpreter)."""
    if not name or name == SYSTEM:
        return system_runtime()
    check_name(name)
    host_dir = os.path.join(runtimes_dir(), name)
    manifest = os.path.join(host_dir, MANIFEST)
    if not os.path.isfile(manifest):
        known = ", ".join(str(r["name"]) for r in list_runtimes())
        raise RuntimeNotUsable(f"runtime {name!r} is not installed (installed: {known}); "
                            f"create it with `execbox runtime install --name {name} PKG...`")
    with open(manifest, encoding="utf-8") as f:
        info = json.load(f)
    return Runtime(name, f"{RUNTIME_MOUNT}/bin/python", host_dir, list(info.get("packages", [])))


Progress = Callable[[str, float], None]
"""Called with (step description, fraction done 0..1)."""


def install(name: str, packages: list[str], progress: Progress | None = None,
            python: str = SYSTEM_PYTHON) -> Runtime:
    """Build runtime ``name`` (a venv from the host interpreter with ``packages``) atomically.

    The venv is built in a temporary directory next to its final place and renamed over it at
    the end, so a box never mounts a half-installed runtime. pip runs with a fixed argv.
    """
    check_name(name)
    if name == SYSTEM:
        raise RuntimeNotUsable("'system' is the host interpreter and cannot be installed over")
    for pkg in packages:
        if not pkg or pkg.startswith("-") or "\x00" in pkg:
            raise RuntimeNotUsable(f"invalid package requirement {pkg!r}")
    report = progress or (lambda _msg, _frac: None)
    root = runtimes_dir()
    os.makedirs(root, mode=0o755, exist_ok=True)
    final = os.path.join(root, name)
    work = tempfile.mkdtemp(prefix=f".{name}-", dir=root)
    os.chmod(work, 0o755)
    try:
        report(f"creating venv from {python}", 0.05)
        # execbox's own pip can install into the new venv (--python), which skips ensurepip;
        # the runtime then holds only what was asked for.
        own_pip = importlib.util.find_spec("pip") is not None
        venv = [python, "-m", "venv"] + (["--without-pip"] if own_pip or not packages else []) + [work]
        subprocess.run(venv, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # noqa: S603
        target = os.path.join(work, "bin", "python")
        pip = ([sys.executable, "-m", "pip", "--python", target] if own_pip else [target, "-m", "pip"]) + [
            "--disable-pip-version-check", "--no-input", "install", "--no-cache-dir", "--progress-bar", "off"]
        for i, pkg in enumerate(packages):
            report(f"installing {pkg}", 0.1 + 0.85 * i / max(1, len(packages)))
            proc = subprocess.run([*pip, "--", pkg], stdout=subprocess.PIPE,  # noqa: S603
                                  stderr=subprocess.STDOUT, text=True)
            if proc.returncode != 0:
                tail = "\n".join(proc.stdout.strip().splitlines()[-5:])
                raise RuntimeNotUsable(f"pip could not install {pkg!r}:\n{tail}")
        report("writing manifest", 0.97)
        with open(os.path.join(work, MANIFEST), "w", encoding="utf-8") as f:
            json.dump({"name": name, "python": python, "packages": packages,
                       "installed_at": time.time()}, f, indent=1)
        for dirpath, dirnames, filenames in os.walk(work):  # readable by the box's uid
            for d in dirnames:
                os.chmod(os.path.join(dirpath, d), 0o755)
            for fn in filenames:
                p = os.path.join(dirpath, fn)
                if not os.path.islink(p):
                    os.chmod(p, os.stat(p).st_mode | 0o444)
        old = None
        if os.path.exists(final):
            old = final + f".old-{os.getpid()}"
            os.rename(final, old)
        os.rename(work, final)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        report("done", 1.0)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return resolve(name)


def remove(name: str) -> bool:
    check_name(name)
    path = os.path.join(runtimes_dir(), name)
    if not os.path.isdir(path):
        return False
    shutil.rmtree(path)
    return True


def staged_agent() -> str:
    """A read-only copy of the agent package as ``<dir>/execbox_agent``; returns ``<dir>``.

    Keyed by a hash of the sources, so an upgrade stages a new copy and a running box keeps
    the one it started with. Boxes mount ``<dir>`` at /opt/execbox, never the source tree.
    """
    src = agent_source_dir()
    files = sorted(f for f in os.listdir(src) if f.endswith((".py", ".js")))
    h = hashlib.sha256(STAGE_FORMAT)
    for fn in files:
        h.update(fn.encode())
        with open(os.path.join(src, fn), "rb") as f:
            h.update(f.read())
    root = os.path.join(jail_dir(), "agent", h.hexdigest()[:16])
    target = os.path.join(root, AGENT_PACKAGE)
    if os.path.isfile(os.path.join(target, ".complete")):
        return root
    os.makedirs(os.path.dirname(root), mode=0o755, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".agent-", dir=os.path.dirname(root))
    os.chmod(tmp, 0o755)
    pkg = os.path.join(tmp, AGENT_PACKAGE)
    os.mkdir(pkg, 0o755)
    for fn in files:
        shutil.copyfile(os.path.join(src, fn), os.path.join(pkg, fn))
        os.chmod(os.path.join(pkg, fn), 0o644)
    compile_agent(pkg)
    open(os.path.join(pkg, ".complete"), "w").close()
    try:
        os.rename(tmp, root)
    except OSError:  # another process staged it first
        shutil.rmtree(tmp, ignore_errors=True)
    for d in (jail_dir(), os.path.dirname(root)):
        _make_traversable(d)
    return root


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


def _make_traversable(path: str) -> None:
    try:
        st = os.stat(path)
        if st.st_mode & 0o005 != 0o005:
            os.chmod(path, st.st_mode | 0o005)
    except OSError:
        pass

