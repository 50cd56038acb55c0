"""The pip and npm steps of a template build, run inside a jail box (runtime_build.py).

A template's packages are whatever the index serves, and their metadata can point elsewhere: a
wheel may declare ``Requires-Dist: x @ https://anywhere/x.tar.gz`` (or ``@ file:///dir``), and
pip fetches and *builds* such a direct-URL requirement whatever ``--only-binary`` says, running
its setup code; an npm package may depend on a URL or a ``file:`` path. So neither tool runs on
the host. One box per build runs both:

* the version being built bound read-write at ``/opt/execbox/runtime`` (where boxes see it; the
  only writable host path), handed to the box's unprivileged uid for the step and taken back
  afterwards (:func:`own_tree`), the box's seccomp filter, limits and ``--die-with-parent`` (pip
  and npm die with the build, also when it is killed);
* network only to the index host(s) through the egress gateway: an allowlist of the configured
  index / registry hosts (plus the addresses an internal mirror resolves to), else ``pypi.org``,
  ``files.pythonhosted.org`` and ``registry.npmjs.org``, exactly as in-session installs get;
* pip as in build_isolation.py (the trusted interpreter, ``-I -S``, wheels only), started through
  :data:`GUARD`, which refuses any direct-URL dependency when the resolver meets it, before
  anything is fetched; npm with ``--ignore-scripts``.

Then the host checks what the build installed (build_sources.py): no ``direct_url.json`` in
site-packages, and every new entry of npm's ``node_modules/.package-lock.json`` a registry
tarball on the registry host reached through a registry version range (no links, URLs, paths or
git). Either refusal fails the build (SB002 naming the dependency), so every byte of a template
comes from the configured index. A mirror on the host's loopback is refused up front (the box's
loopback is its own). A host where no such box can start (no bwrap, not root so no box networking) cannot build
``--pip`` / ``--npm`` templates: SB002 naming what is missing, never a fallback to the host.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from .build_sources import check_npm_sources, check_pip_sources, direct_url_records, npm_lock, shown_index
from .runtime import RUNTIME_MOUNT, RuntimeNotUsable

log = logging.getLogger(__name__)

BUILD_TIMEOUT = 3600.0  # EXECBOX_BUILD_TIMEOUT: the pip + npm step, in the box
MEMORY = 4 << 30
DISK = 64 << 30  # the largest file a tool may write (RLIMIT_FSIZE); downloads go to the build dir
EGRESS_BYTES = 64 << 30  # what the box may download (the gateway's per-box cap)
SCRATCH = ".execbox-tmp"  # pip's and npm's TMPDIR inside the version (host disk, not the box's memory)
NPM_CACHE = ".npm-cache"
REFUSED = "/tmp/execbox-refused.json"
GUARD_PATH = "/tmp/execbox-pip-guard.py"

GUARD = r'''
import json, runpy, sys
from importlib.machinery import PathFinder

PIP_ROOT = "/opt/execbox/pip"  # execbox's own pip, staged read-only (never the template's)


class OurPip:
    @staticmethod
    def find_spec(name, path=None, target=None):
        return PathFinder.find_spec(name, [PIP_ROOT], target) if name == "pip" else None


sys.meta_path.insert(0, OurPip)
try:
    from pip._internal.exceptions import InstallationError
    from pip._internal.resolution.resolvelib.factory import Factory
    from pip._vendor.packaging.requirements import Requirement
    original = Factory.make_requirements_from_spec
except (ImportError, AttributeError) as e:  # fail closed: this pip is unguarded
    sys.exit(f"execbox: cannot guard this pip against direct URL dependencies ({e}); not running it")


def guarded(self, specifier, comes_from, *args, **kwargs):
    try:
        url = Requirement(specifier).url
    except Exception:  # pip reports an invalid requirement itself
        url = None
    if url:
        of = getattr(comes_from, "name", None) or str(comes_from or "")
        with open(REFUSED, "w") as f:
            json.dump({"requirement": str(specifier)[:500], "of": str(of)[:200]}, f)
        raise InstallationError(f"execbox: {of} depends on {specifier!r}, a direct URL requirement; "
                                "only packages from the index are installed")
    return original(self, specifier, comes_from, *args, **kwargs)


Factory.make_requirements_from_spec = guarded
runpy.run_module("pip", run_name="__main__", alter_sys=True)
'''.replace("REFUSED", repr(REFUSED))

PROGRAM = r'''
import json, os, shutil, subprocess


def run(tool, argv, env):
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            env=env, cwd="/tmp")
    tail = []
    for line in proc.stdout:
        line = line.rstrip()
        if line:
            tail = (tail + [line])[-12:]
            print(tool + ": " + line[:300], flush=True)  # streamed to the build's progress
    return proc.wait(), tail


def main(pip_argv, npm_argv, guard, guard_path, refused, scratch):
    os.makedirs(scratch, exist_ok=True)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/workspace", "TMPDIR": scratch, "LANG": "C.UTF-8",
           "npm_config_userconfig": "/nonexistent/npmrc", "npm_config_update_notifier": "false"}
    try:
        if pip_argv:
            with open(guard_path, "w") as f:
                f.write(guard)
            rc, tail = run("pip", pip_argv, env)
            if os.path.exists(refused):
                with open(refused) as f:
                    return {"ok": False, "tool": "pip", "refused": json.load(f), "tail": tail}
            if rc != 0:
                return {"ok": False, "tool": "pip", "exit_code": rc, "tail": tail}
        if npm_argv:
            rc, tail = run("npm", npm_argv, env)
            if rc != 0:
                return {"ok": False, "tool": "npm", "exit_code": rc, "tail": tail}
        return {"ok": True}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
'''


def install_in_box(work: str, pip: list[str], npm: list[str], *, python: str, index_url: str | None,
                   registry: str | None, report: Callable[[str, float], None]) -> None:
    """Install ``pip`` and ``npm`` into the version being built at ``work``, inside a jail box.

    SB002 (RuntimeNotUsable) when no box can start here, a tool failed, or a dependency is not
    from the index; ``work`` is owned by this process again whatever happened."""
    from ..egress.gateway import Limits
    from ..settings import env_duration
    from . import build_isolation, cgroups, jail_box, netns, staging
    from . import runtime as rt
    from .runtime_build import pip_index_args

    npm_bin = box_prerequisites(pip, npm, python, index_url, registry)
    pip_argv = npm_argv = None
    if pip:
        args = ["--disable-pip-version-check", "--no-input", "install", "--no-cache-dir", "--progress-bar", "off",
                "--only-binary", ":all:", *(pip_index_args(index_url) or ["--isolated"]), "--", *pip]
        pip_argv = build_isolation.pip_argv(RUNTIME_MOUNT, args, python, runner=GUARD_PATH)
    if npm:
        npm_argv = [npm_bin, "install", "--prefix", RUNTIME_MOUNT, "--ignore-scripts", "--no-audit",
                    "--no-fund", "--no-update-notifier", "--omit=dev", "--fetch-retries", "1", "--cache",
                    f"{RUNTIME_MOUNT}/{NPM_CACHE}", *(["--registry", registry] if registry else []), "--", *npm]
    try:
        cgroups.detect()
        use_cgroups = True
    except cgroups.CgroupUnavailable:
        use_cgroups = False
    timeout = env_duration("EXECBOX_BUILD_TIMEOUT", BUILD_TIMEOUT)
    jail_box.reap_stale()  # the box (and namespace) of a build that was killed, as a provider's start does
    netns.reap_stale_once()
    caps = Limits.from_env()  # a tenant box's; a build downloads whole wheel sets (torch: gigabytes)
    settings = jail_box.JailSettings(
        runtime=rt.Runtime("build", python, work), memory_bytes=MEMORY, cpus=float(min(4, os.cpu_count() or 1)),
        pids=1024, disk_bytes=DISK, tmp_bytes=256 << 20, preload="none", use_cgroups=use_cgroups,
        agent_root=staging.staged_agent(), egress=box_policy(index_url, registry, bool(pip), bool(npm)),
        writable_runtime=True,
        egress_limits=Limits(max_connections=caps.max_connections, max_bytes=max(caps.max_bytes, EGRESS_BYTES)))
    progress = _Progress(report, bool(pip), bool(npm))
    before_pip = direct_url_records(work)  # a --from parent's: checked when it was built, with its index
    try:
        before_npm = npm_lock(work)
    except (OSError, ValueError):
        before_npm = None
    before_npm = before_npm if isinstance(before_npm, dict) else None
    ended = False  # every process of the box reaped: only then may the host walk what it wrote
    try:
        try:
            box = jail_box.start(settings, None, tmpfs_workspace=True, oneshot=True)
        except Exception as e:  # noqa: BLE001 - any reason a box cannot start here
            raise _no_box(str(getattr(e, "message", e))[:500], "a jail box") from e
        try:
            reply = box.client.call("exec", {
                "language": "python", "code": PROGRAM, "context_id": None, "timeout": timeout,
                "output_cap": 65536, "stream": True,
                "arguments": {"pip_argv": pip_argv, "npm_argv": npm_argv, "guard": GUARD, "guard_path": GUARD_PATH,
                              "refused": REFUSED, "scratch": f"{RUNTIME_MOUNT}/{SCRATCH}"}},
                timeout=timeout + 30, on_event=progress.event)
        except Exception as e:  # noqa: BLE001 - the box died (memory?) or stopped answering
            oom = " (it ran out of memory)" if box.oom_events() else ""
            raise RuntimeNotUsable(f"the build box failed{oom}: {getattr(e, 'message', e)}",
                                   details={"step": "box"}) from e
        finally:
            box.destroy()
            ended = jail_box.drain(30.0)  # every process of the box is gone before the host touches the version
    finally:
        if ended:  # a process still alive could swap a checked path for a link to a host file
            own_tree(work, os.geteuid(), os.getegid())
            shutil.rmtree(os.path.join(work, SCRATCH), ignore_errors=True)
    if not ended:
        raise RuntimeNotUsable("the build box's processes did not all end within 30 s of its teardown; the "
                               "version was not taken back and nothing was published", details={"step": "box"})
    _outcome(reply, timeout, index_url)
    if pip:
        check_pip_sources(work, before_pip)
    if npm:
        check_npm_sources(work, registry, before_npm)


def box_prerequisites(pip: list[str], npm: list[str], python: str, index_url: str | None = None,
                      registry: str | None = None) -> str:
    """SB002 naming what is missing for a build box that runs ``pip`` / ``npm`` (checked before
    the build starts work); returns the npm to run in it ('' without ``npm``)."""
    from . import netns, staging
    from .bwrap import bwrap_path

    if not pip and not npm:
        return ""
    if bwrap_path() is None:
        raise _no_box("bubblewrap (bwrap) is not installed (apt-get install bubblewrap)", "bwrap")
    ok, why = netns.available()
    if not ok:
        raise _no_box(f"a build box reaches the index through the egress gateway, and {why}", "box networking")
    if not os.path.realpath(python).startswith("/usr/"):
        raise RuntimeNotUsable(f"the build interpreter {python} is not under /usr, which is all of the host a box "
                               "sees", details={"field": "python", "value": python})
    if pip and staging.staged_pip() is None:
        raise _no_box("execbox's own pip is not installed", "pip")
    for wanted, url, field in ((pip, index_url, "--index-url"), (npm, registry, "--npm-registry")):
        host = (urlsplit(url).hostname or "") if wanted and url else ""
        if host == "localhost" or host.startswith("127.") or host == "::1":
            raise RuntimeNotUsable(f"{field} {shown_index(url)} is on the host's loopback, which a build box cannot "
                                   "reach (its loopback is its own); serve the mirror on an address of the host",
                                   details={"field": field})
    return _npm_in_box() if npm else ""


def box_policy(index_url: str | None, registry: str | None, pip: bool, npm: bool) -> Any:
    """The build box's egress: the index hosts only (what an in-session install's step gets)."""
    from ..providers.install import index_hosts

    return index_hosts(index_url, registry, pip, npm)


def _npm_in_box() -> str:
    npm_bin = shutil.which("npm")
    if not npm_bin:
        raise RuntimeNotUsable("npm is not installed on this host (apt-get install npm); it installs the "
                               "template's --npm packages", details={"missing": "npm"})
    real = os.path.realpath(npm_bin)
    if not real.startswith("/usr/"):
        raise RuntimeNotUsable(f"npm ({real}) is not under /usr, which is all of the host a build box sees; "
                               "install npm from the distribution (apt-get install npm)", details={"missing": "npm"})
    return real


def _no_box(why: str, missing: str) -> RuntimeNotUsable:
    return RuntimeNotUsable(f"a template's pip and npm steps run in a jail box, and none can start here: {why}; "
                            "nothing was installed (the build never falls back to running them on the host)",
                            details={"missing": missing})


class _Progress:
    """The tools' streamed output lines as the build's progress."""

    def __init__(self, report: Callable[[str, float], None], pip: bool, npm: bool) -> None:
        self.report = report
        self.ranges = {"pip": (0.1, 0.6 if npm else 0.9), "npm": (0.6 if pip else 0.1, 0.9)}
        self.seen = {"pip": 0, "npm": 0}
        self.partial = ""

    def event(self, name: str, data: Any) -> None:
        if name != "stdout" or not isinstance(data, str):
            return
        *lines, self.partial = (self.partial + data).split("\n")
        self.partial = self.partial[-4096:]
        for line in lines:
            tool, _, text = line.partition(": ")
            if tool not in self.ranges:
                continue
            self.seen[tool] += 1
            if text.startswith(("Collecting", "Downloading", "Installing", "Successfully", "added", "npm")):
                lo, hi = self.ranges[tool]
                self.report(f"{tool}: {text.strip()[:70]}", lo + (hi - lo) * (1 - 1 / (1 + self.seen[tool] / 8)))


def _outcome(reply: dict[str, Any], timeout: float, index_url: str | None) -> None:
    """SB002 for a run that did not end with ``{"ok": true}``, naming what failed."""
    out = reply.get("result") or {}
    value = json.loads(out["json"]) if out.get("present") and isinstance(out.get("json"), str) else None
    if reply.get("timed_out"):
        raise RuntimeNotUsable(f"the pip/npm step did not finish within {timeout:g}s (EXECBOX_BUILD_TIMEOUT)",
                               details={"step": "box", "timeout": timeout})
    if not isinstance(value, dict):
        raise RuntimeNotUsable(f"the build box failed: {str(reply.get('stderr') or '')[-1500:]}",
                               details={"step": "box", "exit_code": reply.get("exit_code")})
    if value.get("ok") is True:
        return
    tool = str(value.get("tool"))
    refused = value.get("refused")
    if isinstance(refused, dict):
        req, of = str(refused.get("requirement"))[:300], str(refused.get("of"))[:100]
        raise RuntimeNotUsable(
            f"pip: {of} depends on {req!r}, a direct URL requirement; a template installs only packages from "
            f"the index ({shown_index(index_url) or 'PyPI'}), so the build was refused before fetching it",
            details={"tool": "pip", "dependency": req, "of": of, "reason": "direct_url"})
    tail = "\n".join(str(x) for x in value.get("tail") or [])[-3000:]
    raise RuntimeNotUsable(f"{tool} failed:\n{tail}", details={"tool": tool, "exit_code": value.get("exit_code")})


def _drop_special_bits(path: str, st: os.stat_result) -> None:
    """chmod without following a link: through an O_NOFOLLOW descriptor of the very inode lstat saw."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) == (st.st_dev, st.st_ino):
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o777)
    finally:
        os.close(fd)


def own_tree(root: str, uid: int, gid: int | None = None) -> None:
    """Everything under ``root`` (links themselves, never followed) owned by ``uid``:``gid``, set-id
    and sticky bits dropped, anything but files, directories and symlinks (fifos, sockets) removed."""
    gid = uid if gid is None else gid
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):  # a link to a directory is listed in dirnames, not entered
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                os.unlink(path)
                continue
            os.chown(path, uid, gid, follow_symlinks=False)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o7000:
                _drop_special_bits(path, st)
    os.chown(root, uid, gid)
    os.chmod(root, stat.S_IMODE(os.stat(root).st_mode) & 0o777)
