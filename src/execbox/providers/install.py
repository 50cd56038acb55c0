"""In-session package install (issue 14 part 5b): ``sb.install(pip=[...], npm=[...])``.

pip and npm run *inside* the session's box, as its unprivileged user, so a package's own code
(setup scripts, npm install scripts) stays sandboxed, and every byte they fetch passes the
egress gateway: for the duration of the step the box's policy is replaced by "only the index
hosts" (the operator's ``EXECBOX_PIP_INDEX_URL`` / ``EXECBOX_NPM_REGISTRY``, else pypi.org +
files.pythonhosted.org / registry.npmjs.org, port from the URL), then the session's own policy
is put back. The connections are audited like any other egress and carry the step's run id.

Packages land in a staging directory in the workspace; only when the tool succeeded and the
total size is within the cap are they moved into place (``.execbox/python`` on the box's
``PYTHONPATH`` and ``node_modules`` on ``NODE_PATH``), so a failed or oversized install adds
nothing. Each install holds a lock on its staging directory; one that no live install holds
(left by an install killed at its timeout) is removed at the start of the next install, and
right after a timeout. A box disk limit hit before the size cap (ENOSPC, EFBIG) is reported as
the cap is: 413. The program below is fixed; requirements reach it as JSON arguments, never as
a command line string.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from ..boxes.runtime import SESSION_SITE, WORKSPACE_IN_BOX
from ..boxes.runtime_build import _shown_host, check_specs, pip_index_args, tenant_index_urls
from ..egress.policy import EgressPolicy, parse_entry
from ..errors import (
    ConnectionFailedError,
    ExecutionTimeoutError,
    InvalidConfigError,
    PayloadTooLargeError,
)
from ..settings import env_duration, env_int

DEFAULT_TIMEOUT = 300.0
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
log = logging.getLogger(__name__)
PYPI_URL = "https://pypi.org/simple/"
NPM_URL = "https://registry.npmjs.org/"
PYPI_HOSTS = ("pypi.org:443", "files.pythonhosted.org:443")
NPM_HOSTS = ("registry.npmjs.org:443",)

PROGRAM = r'''
import errno, fcntl, os, re, shutil, signal, subprocess, tempfile

PIP_MOUNT = "/opt/execbox/pip"

NET_ERRORS = ("Failed to establish a new connection", "Max retries exceeded", "Could not fetch URL",
              "Name or service not known", "Temporary failure in name resolution", "Connection refused",
              "ConnectionError", "ReadTimeoutError", "ECONNREFUSED", "ENOTFOUND", "ETIMEDOUT", "EAI_AGAIN",
              "ECONNRESET", "403 Forbidden", "Network is unreachable")
DISK_FULL = ("No space left on device", "[Errno 28]", "ENOSPC", "File too large", "[Errno 27]", "EFBIG",
             "Disk quota exceeded", "[Errno 122]", "EDQUOT")
DISK_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def clear_stale(parent):
    """Remove staging dirs whose install is gone (killed at its timeout): no live one holds their lock."""
    for name in os.listdir(parent) if os.path.isdir(parent) else []:
        if not name.startswith("install-"):
            continue
        path = os.path.join(parent, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a running install's
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def disk_sizes(workspace):
    out = {}
    for key, path in (("workspace_bytes", workspace), ("tmp_bytes", tempfile.gettempdir())):
        try:
            st = os.statvfs(path)
            out[key] = st.f_blocks * st.f_frsize
        except OSError:
            pass
    return out


def disk_full(tool, tail, workspace):
    return {"ok": False, "tool": tool, "reason": "disk_full", "tail": tail, **disk_sizes(workspace)}


def size_of(path):
    total = 0
    for d, _dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(d, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def package_name(tool, spec):
    if tool == "npm":
        head, at, _rest = spec[1:].partition("@")
        return spec[0] + head if at else spec
    return re.split(r"[\[<>=!~]", spec)[0]


def reachable(url):
    """Can the box reach the index at all? (pip prints no network error when it gives up quietly)"""
    import urllib.error, urllib.request
    try:
        urllib.request.urlopen(url, timeout=10).close()
    except urllib.error.HTTPError as e:
        return e.headers.get("X-Execbox-Egress") != "denied"
    except Exception:
        return False
    return True


def missing_name(tool, text):
    """The requirement the tool itself says it could not find (pip: also a build requirement)."""
    pattern = (r"No matching distribution found for (\S+)" if tool == "pip"
               else r"'(@?[^'@\s]+)@[^'\s]*' is not in this registry")
    found = re.search(pattern, text)
    return found.group(1) if found else None


def canonical(tool, spec):
    name = package_name(tool, spec).lower()
    return re.sub(r"[-_.]+", "-", name) if tool == "pip" else name


def classify(tool, text, pkgs, index):
    if any(m in text for m in NET_ERRORS) or not reachable(index):
        return "index_unreachable", None
    if not any(m in text for m in ("No matching distribution", "E404", "404 Not Found", "not in this registry")):
        return "failed", None
    missing = missing_name(tool, text)
    if missing is not None:
        for pkg in pkgs:
            if canonical(tool, pkg) == canonical(tool, missing):
                return "unknown_package", pkg
        return "missing_dependency", missing
    low = text.lower()
    for pkg in pkgs:
        if package_name(tool, pkg).lower() in low:
            return "unknown_package", pkg
    return "unknown_package", None


def move_into(src, dest):
    os.makedirs(dest, exist_ok=True)
    for entry in os.listdir(src):
        if entry in (".package-lock.json", ".bin"):
            continue
        target = os.path.join(dest, entry)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        elif os.path.lexists(target):
            os.unlink(target)
        os.replace(os.path.join(src, entry), target)


def main(pip, npm, pip_args, pip_index, registry, site, workspace, max_bytes, tool_timeout, clear_only=False):
    parent = os.path.join(workspace, ".execbox")
    clear_stale(parent)
    if clear_only:
        return {"ok": True}
    try:
        os.makedirs(parent, exist_ok=True)
        stage = tempfile.mkdtemp(prefix="install-", dir=parent)
    except OSError as e:
        if e.errno in DISK_ERRNOS:
            return disk_full("pip" if pip else "npm", str(e), workspace)
        raise
    lock = os.open(stage, os.O_RDONLY | os.O_DIRECTORY)  # held until this process ends: not stale
    fcntl.flock(lock, fcntl.LOCK_EX)
    env = dict(os.environ, PIP_NO_CACHE_DIR="1", npm_config_update_notifier="false")
    try:
        return install(pip, npm, pip_args, pip_index, registry, site, workspace, max_bytes, tool_timeout, stage,
                       env)
    except OSError as e:
        if e.errno in DISK_ERRNOS:
            return disk_full("pip" if pip else "npm", str(e), workspace)
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        os.close(lock)


def install(pip, npm, pip_args, pip_index, registry, site, workspace, max_bytes, tool_timeout, stage, env):
    steps = []
    if pip:
        py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"
        if os.path.isdir(os.path.join(PIP_MOUNT, "pip")):  # execbox's copy of pip, else the system's
            env["PYTHONPATH"] = PIP_MOUNT
        steps.append(("pip", pip, [py, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                                   "--no-cache-dir", "--progress-bar", "off", "--retries", "0", "--timeout",
                                   "15", "--target", os.path.join(stage, "py"), *pip_args, "--", *pip]))
    if npm:
        npm_bin = shutil.which("npm")
        if npm_bin is None:
            return {"ok": False, "tool": "npm", "reason": "missing_tool", "tail": "npm is not installed"}
        steps.append(("npm", npm, [npm_bin, "install", "--prefix", os.path.join(stage, "js"), "--no-audit",
                                   "--no-fund", "--no-package-lock", "--fetch-retries", "0", "--fetch-timeout",
                                   "15000", "--cache", os.path.join(stage, "npm-cache"),
                                   "--registry", registry, "--", *npm]))
    for tool, pkgs, argv in steps:
        try:
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                  timeout=tool_timeout, cwd=stage)
        except subprocess.TimeoutExpired:
            return {"ok": False, "tool": tool, "reason": "timeout", "tail": ""}
        if proc.returncode != 0:
            text = proc.stdout
            tail = "\n".join(text.strip().splitlines()[-8:])
            if proc.returncode == -signal.SIGXFSZ or any(m in text for m in DISK_FULL):
                return disk_full(tool, tail, workspace)
            if tool == "pip" and "No module named pip" in text:
                return {"ok": False, "tool": tool, "reason": "missing_tool", "tail": "pip is not installed"}
            reason, pkg = classify(tool, text, pkgs, pip_index if tool == "pip" else registry)
            return {"ok": False, "tool": tool, "reason": reason, "package": pkg, "tail": tail}
    shutil.rmtree(os.path.join(stage, "npm-cache"), ignore_errors=True)
    total = size_of(stage)
    if total > max_bytes:
        return {"ok": False, "tool": "pip" if pip else "npm", "reason": "too_large", "bytes": total}
    if pip:
        move_into(os.path.join(stage, "py"), site)
    if npm:
        move_into(os.path.join(stage, "js", "node_modules"), os.path.join(workspace, "node_modules"))
    return {"ok": True, "bytes": total}
'''


def index_hosts(pip_url: str | None, npm_url: str | None, pip: bool, npm: bool) -> EgressPolicy:
    """The policy the box gets for the install step: the index hosts only.

    An operator's mirror is usually internal: a name that resolves into a private range (or to
    an address of the host), which no hostname entry reaches. The operator named it, so each such
    address it resolves to now is allowed too, as an exact /32 on the mirror's port, for the step.
    """
    entries: list[str] = []
    for wanted, url, defaults in ((pip, pip_url, PYPI_HOSTS), (npm, npm_url, NPM_HOSTS)):
        if not wanted:
            continue
        if url:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            entries.append(f"{parts.hostname}:{port}")
            entries += [f"{ip}/32:{port}" for ip in _internal_addresses(parts.hostname or "")]
        else:
            entries.extend(defaults)
    return EgressPolicy("allowlist", tuple(parse_entry(e) for e in dict.fromkeys(entries)))


def _internal_addresses(host: str) -> list[str]:
    """The addresses ``host`` (an operator's mirror) resolves to that only an IP entry unlocks."""
    import ipaddress

    from ..egress.policy import ALWAYS_DENIED, is_host_address
    from ..egress.resolver import resolve_sync

    try:
        ipaddress.IPv4Address(host)
        return []  # an IP literal is an IP entry already
    except ValueError:
        pass
    return [str(ip) for ip in resolve_sync(host) if any(ip in n for n in ALWAYS_DENIED) or is_host_address(ip)]


def run_install(provider: Any, instance_id: str, pip: list[str] | None, npm: list[str] | None,
                timeout: float | None = None) -> dict[str, Any]:
    """Install into a live instance's workspace; raises an SB error naming the package or index."""
    from .agent_egress import egress_link

    pip, npm = list(pip or []), list(npm or [])
    if not pip and not npm:
        raise InvalidConfigError("install needs at least one pip or npm package", details={"field": "pip"})
    check_specs(pip, npm)
    pip_url, npm_url = tenant_index_urls()
    inst = provider._get(instance_id)
    link = egress_link(inst.box)
    if link is None:
        raise InvalidConfigError(
            f"provider {provider.name!r} started this box without network, so it cannot reach a package index; "
            "set the provider's network to allowlist (the index hosts are allowed only during the install) "
            "or use a runtime template (`execbox runtime build`)",
            details={"field": "network", "provider": provider.name})
    limit = float(provider.config.get("max_timeout") or DEFAULT_TIMEOUT)
    seconds = min(float(timeout or env_duration("EXECBOX_INSTALL_TIMEOUT", DEFAULT_TIMEOUT)), limit)
    max_bytes = env_int("EXECBOX_INSTALL_MAX_BYTES", DEFAULT_MAX_BYTES, 1)  # a typo is SB002, not the default
    step = index_hosts(pip_url, npm_url, bool(pip), bool(npm))
    args = {"pip": pip, "npm": npm, "pip_args": pip_index_args(pip_url) or ["--isolated"],
            "pip_index": pip_url or PYPI_URL, "registry": npm_url or NPM_URL,
            "site": SESSION_SITE, "workspace": WORKSPACE_IN_BOX, "max_bytes": max_bytes,
            "tool_timeout": max(5.0, seconds - 5)}
    with inst.egress_lock:  # never interleaved with a narrowing's own set_policy
        link.set_policy(step)
    try:
        result = provider._exec(instance_id, {"language": "python", "code": PROGRAM, "arguments": args,
                                              "context_id": None}, seconds, None, False)
    finally:
        with inst.egress_lock:  # the session's policy as it is now, also if narrowed meanwhile
            link.set_policy(provider.enforced_egress(inst))
    if result.error_code == "SB005":
        _clear_stale(provider, instance_id, args)
    disk_mb = (provider.applied_limits() or {}).get("disk_quota_mb")
    return _outcome(result, pip, npm, pip_url, npm_url, seconds, max_bytes, step, disk_mb)


def _clear_stale(provider: Any, instance_id: str, args: dict[str, Any]) -> None:
    """After a timeout killed the install: remove its staging dir now (the next install would too)."""
    try:
        provider._exec(instance_id, {"language": "python", "code": PROGRAM, "context_id": None,
                                     "arguments": {**args, "clear_only": True}}, 30, None, False)
    except Exception as e:  # noqa: BLE001 - best effort: the box may be gone; the next install retries
        log.warning("install: could not remove the staging dir of a timed out install in %s: %s", instance_id, e)


def _mib(n: Any) -> str:
    return f"{n / (1024 * 1024):.0f} MiB" if isinstance(n, (int, float)) else "?"


def _outcome(result: Any, pip: list[str], npm: list[str], pip_url: str | None, npm_url: str | None,
             seconds: float, max_bytes: int, step: EgressPolicy, disk_mb: Any = None) -> dict[str, Any]:
    run_id = (result.metadata or {}).get("egress_run_id")
    base = {"pip": pip, "npm": npm, "egress_run_id": run_id, "allowed_during_install": step.to_dict()["allow"]}
    if result.error_code == "SB005":
        raise ExecutionTimeoutError(f"install did not finish within {seconds:g}s; nothing was installed",
                                    details=base)
    out = result.result if isinstance(result.result, dict) else None
    if out is None:
        stderr = scrub(result.stderr or "", pip_url, npm_url)
        raise InvalidConfigError(f"install failed inside the box: {stderr[-800:]}", details=base, http_status=422)
    if out.get("ok"):
        return {**base, "installed": True, "bytes": out.get("bytes", 0)}
    tool = out.get("tool", "pip")
    # the tenant sees the index as scheme://host[:port]/… only: its path may hold a token
    index = _shown_host((pip_url or PYPI_URL) if tool == "pip" else (npm_url or NPM_URL)) or "(the index)"
    tail = scrub(out.get("tail", ""), pip_url, npm_url)
    details = {**base, "tool": tool, "index": index, "reason": out.get("reason"), "output": tail}
    reason = out.get("reason")
    if reason == "unknown_package":
        pkg = out.get("package")
        what = f"package {pkg!r}" if pkg else f"one of {pip if tool == 'pip' else npm}"
        raise InvalidConfigError(f"{tool}: {what} was not found on the index {index}",
                                 details={**details, "package": pkg}, http_status=404)
    if reason == "missing_dependency":
        dep = out.get("package")
        asked = pip if tool == "pip" else npm
        raise InvalidConfigError(f"{tool}: {dep!r}, needed by {', '.join(asked)} (a dependency or build "
                                 f"requirement), was not found on the index {index}",
                                 details={**details, "package": dep, "dependency": True}, http_status=404)
    if reason == "index_unreachable":
        raise ConnectionFailedError(f"{tool}: the package index {index} is unreachable from the box",
                                    details=details)
    if reason == "too_large":
        raise PayloadTooLargeError(f"install would add {out.get('bytes')} bytes, over the cap of {max_bytes} "
                                   "(EXECBOX_INSTALL_MAX_BYTES); nothing was installed",
                                   details={**details, "bytes": out.get("bytes"), "max_bytes": max_bytes})
    if reason == "disk_full":
        limit = f"disk_quota_mb={disk_mb}" if disk_mb else "the provider's disk quota"
        raise PayloadTooLargeError(
            f"{tool}: the box ran out of disk space while installing (its limit: {limit}; workspace "
            f"{_mib(out.get('workspace_bytes'))}, /tmp {_mib(out.get('tmp_bytes'))}), before the install size cap "
            f"(EXECBOX_INSTALL_MAX_BYTES={max_bytes}) was checked; nothing was installed. Install less, or raise "
            "the provider's disk_quota_mb",
            details={**details, "max_bytes": max_bytes, "disk_quota_mb": disk_mb,
                     "workspace_bytes": out.get("workspace_bytes"), "tmp_bytes": out.get("tmp_bytes")})
    if reason == "timeout":
        raise ExecutionTimeoutError(f"{tool} did not finish within the install timeout", details=details)
    if reason == "missing_tool":
        raise InvalidConfigError(f"{tool} is not available in this box's runtime; install it on the host "
                                 "(jail boxes see the host's /usr) or use a runtime template", details=details)
    raise InvalidConfigError(f"{tool} install failed: {tail[-600:]}", details=details, http_status=422)


def scrub(text: str, *urls: str | None) -> str:
    """``text`` with each index URL (and what follows it, e.g. ``/simple/pkg/``) shown as
    ``scheme://host[:port]/…``: tool output names the index, whose path may hold a token."""
    for url in urls:
        if not url or not urlsplit(url).path.strip("/"):
            continue
        shown = _shown_host(url) or "(the index)"
        for form in (url, url.rstrip("/")):
            text = text.replace(form, shown)
    return text
