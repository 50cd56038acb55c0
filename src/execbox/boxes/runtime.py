"""Sandbox runtimes: the Python a box runs, kept apart from execbox's own installation.

A box never sees execbox's virtualenv, source tree, data dir or the host's home. It runs
either the host's Debian interpreter with its standard library (runtime ``system``, the
default) or a named runtime template: a venv built from that same interpreter (plus npm
packages in ``node_modules``) under ``<jail dir>/runtimes/<name>/v<N>``, mounted read-only at
``/opt/execbox/runtime``. Versions are immutable: a build makes ``v<N+1>`` next to the others
and then swaps the ``current`` symlink, so a failed build leaves the previous version in use
and a running box keeps the version it started with (runtime_build.py). The agent
package is copied (not bind-mounted from the source tree) into ``<jail dir>/agent/<hash>``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import InvalidConfigError
from .images import MPL_SEED as IMAGE_MPL_SEED

SYSTEM_PYTHON = "/usr/bin/python3"
SYSTEM = "system"
RUNTIME_MOUNT = "/opt/execbox/runtime"
MPL_SEED = "mpl-seed"
"""A version's matplotlib font cache (when it has matplotlib): boxes copy it into their empty
MPLCONFIGDIR instead of scanning the fonts again (agent/runners.py ``seed_matplotlib_cache``)."""
AGENT_ROOT_IN_BOX = "/opt/execbox"
AGENT_PACKAGE = "execbox_agent"
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")  # always fullmatch: "$" would accept a trailing newline
_VERSION = re.compile(r"v[1-9][0-9]{0,8}")
MANIFEST = "execbox-runtime.json"
CURRENT = "current"  # symlink to the version new boxes mount
WORKSPACE_IN_BOX = "/workspace"
SESSION_SITE = f"{WORKSPACE_IN_BOX}/.execbox/python"  # where sb.install(pip=...) puts packages
PIP_MOUNT = "/opt/execbox/pip"  # a read-only copy of pip for in-session installs (boxes with network)
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
    """What a box mounts and runs for Python (and finds with ``require()`` for Node)."""

    name: str
    python: str  # the interpreter path inside the box
    host_dir: str | None = None  # runtime directory on the host (None: the system interpreter)
    packages: list[str] = field(default_factory=list)
    npm: list[str] = field(default_factory=list)
    version: str = ""  # "v3" for a built template, "legacy" for an old unversioned install

    def mounts(self) -> list[tuple[str, str]]:
        """What a box binds for this runtime (read-only). SB002 when the version was removed
        (`execbox runtime rm`) after this Runtime was looked up."""
        if not self.host_dir:
            return []
        if not os.path.isdir(self.host_dir):
            raise RuntimeNotUsable(f"runtime {self.ref} was removed (execbox runtime rm); build it again or "
                                   "pick another version", details={"field": "runtime", "value": self.ref})
        return [(self.host_dir, RUNTIME_MOUNT)]

    @property
    def ref(self) -> str:
        """``name@version`` (what result metadata and the console show)."""
        return f"{self.name}@{self.version}" if self.version and self.version != "legacy" else self.name

    def env(self) -> dict[str, str]:
        """Box environment for this runtime: in-session installs first, then the template's packages."""
        node = [f"{WORKSPACE_IN_BOX}/node_modules"] + ([f"{RUNTIME_MOUNT}/node_modules"] if self.npm else [])
        path = "/usr/local/bin:/usr/bin:/bin"
        env = {"NODE_PATH": ":".join(node), "PYTHONPATH": SESSION_SITE}
        if self.host_dir:
            path = f"{RUNTIME_MOUNT}/bin:" + (f"{RUNTIME_MOUNT}/node_modules/.bin:" if self.npm else "") + path
            if os.path.isdir(os.path.join(self.host_dir, MPL_SEED)):  # built with matplotlib (runtime_build)
                # then the base image's, for a template image whose matplotlib is the image's own
                env["EXECBOX_MPL_SEED"] = f"{RUNTIME_MOUNT}/{MPL_SEED}:{IMAGE_MPL_SEED}"
        return {**env, "PATH": path}


class RuntimeNotUsable(InvalidConfigError):
    """An unknown or broken runtime name, or a failed build (SB002, HTTP 400; 409: in use)."""

    def __init__(self, message: str, details: dict | None = None, http_status: int | None = None) -> None:
        super().__init__(message, details=details or {}, http_status=http_status)


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RuntimeNotUsable(f"runtime name {name!r} is invalid: use lowercase letters, digits, '.', '_', '-'",
                               details={"field": "runtime", "value": str(name)[:80]})
    return name


def is_version(text: str) -> bool:
    """``v<N>``, exactly (a version directory's name)."""
    return _VERSION.fullmatch(text) is not None


def parse_ref(ref: str) -> tuple[str, str | None]:
    """The one validator of a template reference: ``NAME`` -> (NAME, None), ``NAME@vN`` (or
    ``NAME@N``) -> (NAME, "vN"). SB002 for a bad name or an empty or malformed version."""
    if not isinstance(ref, str):
        raise RuntimeNotUsable(f"runtime {ref!r} is invalid: give NAME or NAME@vN",
                               details={"field": "runtime", "value": str(ref)[:80]})
    base, at, pinned = ref.partition("@")
    check_name(base)
    if not at:
        return base, None
    version = f"v{pinned}" if pinned.isascii() and pinned.isdigit() else pinned
    if not is_version(version):
        raise RuntimeNotUsable(f"runtime {ref!r} is invalid: give NAME or NAME@vN",
                               details={"field": "runtime", "value": ref[:80]})
    return base, version


def system_runtime() -> Runtime:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        raise RuntimeNotUsable(f"{SYSTEM_PYTHON} is missing: the system runtime needs the host's python3")
    return Runtime(SYSTEM, SYSTEM_PYTHON)


def _read_manifest(directory: str) -> dict | None:
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def versions(name: str) -> list[str]:
    """Built versions of template ``name``, oldest first (``v1``, ``v2``, ...)."""
    d = os.path.join(runtimes_dir(), check_name(name))
    if not os.path.isdir(d):
        return []
    found = [v for v in os.listdir(d) if is_version(v) and os.path.isfile(os.path.join(d, v, MANIFEST))]
    return sorted(found, key=lambda v: int(v[1:]))


def current_version(name: str) -> str | None:
    link = os.path.join(runtimes_dir(), check_name(name), CURRENT)
    try:
        target = os.readlink(link)
    except OSError:
        return None
    return target if is_version(target) else None


def _usable_names() -> list[str]:
    """Runtimes a config can name now: a current version (or a legacy manifest). A directory that is
    still being built (or was left half-made) has neither and is skipped, not an error."""
    root = runtimes_dir()
    if not os.path.isdir(root):
        return []
    return [n for n in sorted(os.listdir(root)) if _NAME.fullmatch(n)
            and (current_version(n) is not None or _read_manifest(os.path.join(root, n)) is not None)]


def list_runtimes() -> list[dict[str, object]]:
    out: list[dict[str, object]] = [{"name": SYSTEM, "python": SYSTEM_PYTHON, "packages": [], "npm": [],
                                     "path": None, "version": "", "versions": []}]
    for name in _usable_names():
        try:
            r = resolve(name)
        except RuntimeNotUsable:  # its current version's manifest is gone
            continue
        info = _read_manifest(r.host_dir or "") or {}
        out.append({"name": name, "python": info.get("python"), "packages": r.packages, "npm": r.npm,
                    "path": r.host_dir, "version": r.version, "versions": versions(name),
                    "from": info.get("from"), "installed_at": info.get("installed_at")})
    return out


def resolve(name: str | None, list_known: bool = False) -> Runtime:
    """The runtime a config or request names: '' or 'system' (host interpreter), ``NAME`` (its
    current version) or ``NAME@vN`` (one pinned version). Unknown: RuntimeNotUsable (SB002),
    naming the templates there are only with ``list_known`` (the operator's CLI and admin API):
    templates are host-wide, and a tenant's error must not list the names others use."""
    if not name or name == SYSTEM:
        return system_runtime()
    base, pinned = parse_ref(name)
    top = os.path.join(runtimes_dir(), base)
    legacy = _read_manifest(top)
    if legacy is not None and not pinned:
        return Runtime(base, f"{RUNTIME_MOUNT}/bin/python", top, list(legacy.get("packages", [])),
                       list(legacy.get("npm", [])), "legacy")
    version = pinned or current_version(base)
    info = _read_manifest(os.path.join(top, version)) if version else None
    if info is None:
        what = f"runtime {name!r} is not installed" if not pinned else f"runtime {base!r} has no version {version}"
        if not list_known:
            raise RuntimeNotUsable(f"{what}; the operator builds templates (`execbox runtime list` shows them)",
                                   details={"field": "runtime", "value": name[:80]})
        known = ", ".join([SYSTEM, *_usable_names()])
        raise RuntimeNotUsable(f"{what} (installed: {known}); build it with "
                               f"`execbox runtime build {base} --pip PKG --npm PKG`",
                               details={"field": "runtime", "value": name[:80]})
    return Runtime(base, f"{RUNTIME_MOUNT}/bin/python", os.path.join(top, version), list(info.get("packages", [])),
                   list(info.get("npm", [])), version)


def describe(r: Runtime) -> dict[str, object]:
    """One runtime version for `runtime show`, the admin API and the console."""
    info = _read_manifest(r.host_dir) if r.host_dir else None
    info = info or {}
    return {"name": r.name, "ref": r.ref, "version": r.version or "-", "python": info.get("python", r.python),
            "pip": r.packages, "npm": r.npm, "from": info.get("from"), "pip_index": info.get("pip_index"),
            "npm_registry": info.get("npm_registry"), "path": r.host_dir, "installed_at": info.get("installed_at"),
            "versions": versions(r.name) if r.host_dir and r.version != "legacy" else []}


def still_current(ref: str | None, r: Runtime) -> bool:
    """Whether ``r``, looked up from ``ref`` earlier, is still what ``ref`` means: for ``NAME`` its
    current version, for ``NAME@vN`` that version not removed. Cheap (a readlink or a stat): a warm
    pool asks it of each ready box."""
    if not ref or ref == SYSTEM or not r.host_dir:
        return True
    base, pinned = parse_ref(ref)
    if pinned or r.version == "legacy":
        return os.path.isdir(r.host_dir)
    return current_version(base) == r.version


def resolve_runtime(name: str | None) -> Runtime:
    """Public lookup for other layers (sessions, the E2B template mapping): SB002 when unknown,
    without listing the other templates (its caller may be a tenant)."""
    return resolve(name)


Progress = Callable[[str, float], None]
"""Called with (step description, fraction done 0..1)."""


def install(name: str, packages: list[str], progress: Progress | None = None,
            python: str = SYSTEM_PYTHON) -> Runtime:
    """Build a new version of runtime ``name`` with pip ``packages`` (kept for `runtime install`)."""
    from .runtime_build import build

    return build(name, pip=packages, progress=progress, python=python)


def remove(name: str, force: bool = False) -> bool:
    """Delete runtime ``name`` (all versions) or one version ``name@vN`` (not the current one).

    False when it is not installed. SB002 (HTTP 409) while a running box mounts what would go
    (any process's box: runtime_use.boxes_using), unless ``force``. The directory is renamed
    away first, so no box can start on it while it is checked and deleted. The Docker images of
    the versions removed go too, when an engine answers (best effort). Version numbers are not
    given out again (runtime_publish.py), so a pin ``NAME@vN`` never comes to mean other content.
    """
    base, version = parse_ref(name)
    top = os.path.join(runtimes_dir(), base)
    if not os.path.isdir(top):
        return False
    if version is not None:
        path = os.path.join(top, version)
        if not os.path.isdir(path):
            return False
        if current_version(base) == version:
            raise RuntimeNotUsable(f"{base}@{version} is the current version; build a newer one first or "
                                   f"remove the whole runtime with `execbox runtime rm {base}`",
                                   details={"field": "runtime", "value": name})
    else:
        path = top
    ref = f"{base}@{version}" if version else base
    if not force:
        _refuse_in_use(ref, path)
    trash = os.path.join(os.path.dirname(path), f".rm-{os.path.basename(path)}-{os.urandom(4).hex()}")
    os.rename(path, trash)
    if not force:
        try:
            _refuse_in_use(ref, trash)  # a box that started in between
        except RuntimeNotUsable as e:
            try:
                os.rename(trash, path)
            except OSError as why:  # a build made the name again meanwhile
                raise RuntimeNotUsable(f"{e.message}; it was kept as {trash} ({why})", details=e.details,
                                       http_status=409) from None
            raise
    images = [(version, trash)] if version else \
        [(v, os.path.join(trash, v)) for v in os.listdir(trash) if is_version(v)]
    from .runtime_docker import manifest_digest, remove_images

    built = [(v, manifest_digest(d)) for v, d in images]
    _rmtree(trash)
    remove_images(base, built)
    return True


def _refuse_in_use(ref: str, path: str) -> None:
    from .runtime_use import boxes_using

    dirs = [path] if os.path.isfile(os.path.join(path, MANIFEST)) else \
        [os.path.join(path, v) for v in os.listdir(path) if is_version(v)] + [path]
    users = boxes_using(dirs)
    if users:
        raise RuntimeNotUsable(
            f"runtime {ref} is in use by {len(users)} running box(es) (host pids {', '.join(map(str, users[:5]))}); "
            "close their sessions first, or remove it anyway with --force (those boxes lose their runtime)",
            details={"field": "runtime", "value": ref, "in_use_pids": users[:20]}, http_status=409)


def _rmtree(path: str) -> None:
    from .runtime_build import make_writable

    make_writable(path)
    shutil.rmtree(path)
