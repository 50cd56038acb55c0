"""Building runtime templates: ``execbox runtime build NAME --pip ... --npm ... [--from BASE]``.

A build happens in a hidden directory next to the template's versions and becomes ``v<N+1>``
only when everything succeeded; then the ``current`` symlink is swapped atomically. A failure at
any step removes the half-built directory and leaves the previous version current.

Packages come from the operator's index (``EXECBOX_PIP_INDEX_URL``, ``EXECBOX_NPM_REGISTRY``:
internal mirrors) or the tools' defaults. No package code runs on the host: pip and npm run in a
jail box whose only writable host path is the version being built and whose network reaches the
index hosts only (build_box.py); pip takes wheels only (``--only-binary :all:``), runs under the
trusted interpreter without site processing and refuses direct-URL dependencies, npm runs with
``--ignore-scripts``, and matplotlib's font list is made in a jail box without network
(build_isolation.py). Requirements are plain names with version specifiers; URLs, paths and VCS
references are refused, and so is a dependency that is not a package from the index, so every
byte comes from the configured index.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from typing import Any
from urllib.parse import urlsplit

from . import runtime as rt
from .build_box import NPM_CACHE, box_prerequisites, install_in_box
from .build_isolation import NoBox, font_lists_in_box, has_matplotlib, reset_interpreter
from .runtime import MANIFEST, Runtime, RuntimeNotUsable
from .staging import make_traversable

log = logging.getLogger(__name__)

# always fullmatch: with match, "$" also accepts a trailing newline
_PIP_SPEC = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?([<>=!~]=?[A-Za-z0-9.*+!-]+"
                       r"(,[<>=!~]=?[A-Za-z0-9.*+!-]+)*)?")
_NPM_SPEC = re.compile(r"(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*(@[A-Za-z0-9.^~<>=*|+ -]+)?")
PIP_INDEX_ENV = "EXECBOX_PIP_INDEX_URL"
NPM_REGISTRY_ENV = "EXECBOX_NPM_REGISTRY"


def check_specs(pip: list[str], npm: list[str]) -> None:
    """SB002 naming the first requirement that is not ``name[extras][specifier]`` / ``name[@range]``."""
    for spec in pip:
        if not isinstance(spec, str) or len(spec) > 200 or not _PIP_SPEC.fullmatch(spec):
            raise RuntimeNotUsable(f"pip requirement {spec!r} is invalid: give a package name with an optional "
                                   "version specifier (no URLs, paths or options)",
                                   details={"field": "pip", "value": str(spec)[:200]})
    for spec in npm:
        if not isinstance(spec, str) or len(spec) > 200 or not _NPM_SPEC.fullmatch(spec):
            raise RuntimeNotUsable(f"npm package {spec!r} is invalid: give a package name with an optional "
                                   "@version (no URLs, paths, git or file specs)",
                                   details={"field": "npm", "value": str(spec)[:200]})


def check_index_url(url: str | None, field: str) -> str | None:
    """``url`` when it is an http(s) URL with a host, no credentials, no query string and no
    fragment; else SB002 naming ``field`` and at most the URL's scheme, host and port: never the
    value, whose userinfo or query may hold a token (GitLab ``https://__token__:PAT@...``, Azure
    Artifacts, Artifactory ``?token=...``). A token in the path cannot be told from a path."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and "@" not in parts.netloc \
            and not parts.query and not parts.fragment and "?" not in url and "#" not in url
    except ValueError:  # e.g. an unclosed IPv6 bracket
        parts, ok = None, False
    if not ok:
        where = _shown_host(parts)
        raise RuntimeNotUsable(f"{field}{f' ({where})' if where else ''} must be an http(s) URL with a host "
                               "and without credentials (user:password@), query string (?...) or fragment "
                               "(#...)", details={"field": field})
    return url


def _shown_host(parts: Any) -> str:
    """``scheme://host[:port]/…`` of a URL or parsed URL (no userinfo, path or query), or '' if it
    has none: how a package index is named to tenants (providers/install.py) and in refusals."""
    try:
        if isinstance(parts, str):
            parts = urlsplit(parts)
        host, port = parts.hostname, parts.port
    except (AttributeError, ValueError):
        return ""
    if not host or parts.scheme not in ("http", "https"):
        return ""
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{f':{port}' if port else ''}/…"


def check_index_settings() -> None:
    """``EXECBOX_PIP_INDEX_URL`` and ``EXECBOX_NPM_REGISTRY`` as ``execbox serve`` checks them at
    start (SB002 naming the variable, never its value), so a tenant's install never meets them."""
    pip_index_url()
    npm_registry()


def tenant_index_urls() -> tuple[str | None, str | None]:
    """The pip index and npm registry for a tenant's in-session install. A misconfigured one (the
    service checked them at start, so the environment changed under it, or this is a library
    caller) is SB002 saying that the operator's setting is invalid, naming the variable only."""
    try:
        return pip_index_url(), npm_registry()
    except RuntimeNotUsable as e:
        field = e.details.get("field", "the package index setting")
        raise RuntimeNotUsable(f"the operator's package index setting {field} is invalid; ask the operator to "
                               "fix it", details={"field": field}) from None


def pip_index_url(override: str | None = None) -> str | None:
    """The pip index to use: an explicit one, else ``EXECBOX_PIP_INDEX_URL``, else pip's default."""
    return check_index_url(override or os.environ.get(PIP_INDEX_ENV, "").strip() or None, PIP_INDEX_ENV)


def npm_registry(override: str | None = None) -> str | None:
    return check_index_url(override or os.environ.get(NPM_REGISTRY_ENV, "").strip() or None, NPM_REGISTRY_ENV)


def pip_index_args(index_url: str | None) -> list[str]:
    """``--isolated --index-url URL`` (plus ``--trusted-host`` for an http mirror the operator named)."""
    if not index_url:
        return []
    args = ["--isolated", "--index-url", index_url]
    if urlsplit(index_url).scheme == "http":
        args += ["--trusted-host", urlsplit(index_url).hostname or ""]
    return args


def build(name: str, pip: list[str] | None = None, npm: list[str] | None = None, *, base: str | None = None,
          progress: rt.Progress | None = None, python: str = rt.SYSTEM_PYTHON, index_url: str | None = None,
          registry: str | None = None, docker: Any = None) -> Runtime:
    """Build a new immutable version of runtime template ``name`` and make it current.

    ``docker``: a docker client; the version is then also built as the image
    ``execbox/runtime-<name>:v<N>`` for the docker provider (before it becomes current).
    """
    pip, npm = list(pip or []), list(npm or [])
    rt.check_name(name)
    if docker is not None:  # before any work: Docker's name grammar is narrower than execbox's
        from .runtime_docker import check_image_name

        check_image_name(name)
    if name == rt.SYSTEM:
        raise RuntimeNotUsable("'system' is the host interpreter and cannot be built over",
                               details={"field": "name", "value": name})
    check_specs(pip, npm)
    index_url, registry = pip_index_url(index_url), npm_registry(registry)
    report = progress or (lambda _msg, _frac: None)
    top = os.path.join(rt.runtimes_dir(), name)
    if os.path.isfile(os.path.join(top, MANIFEST)):
        raise RuntimeNotUsable(f"runtime {name!r} was installed by an older execbox without versions; remove "
                               f"it with `execbox runtime rm {name}` and build it again",
                               details={"field": "name", "value": name})
    parent = rt.resolve(base) if base else None
    if parent is not None and parent.host_dir is None:
        parent = None  # --from system: the plain interpreter is what every build starts from
    if parent is not None:  # the manifest is execbox's (written after the packages), not a package's
        built_with = (rt._read_manifest(parent.host_dir or "") or {}).get("python")
        if built_with != python:
            raise RuntimeNotUsable(f"--from {parent.ref}: it was built with {built_with!r}, this build uses "
                                   f"{python!r}; a version only adds packages for the same interpreter",
                                   details={"field": "base", "value": parent.ref})
    box_prerequisites(pip, npm, python, index_url, registry)  # SB002 naming what is missing: no host fallback
    os.makedirs(top, mode=0o755, exist_ok=True)
    make_traversable(rt.runtimes_dir())
    work, held = new_build_dir(top)
    temp_tag: str | None = None
    os.chmod(work, 0o755)
    try:
        if parent is not None:
            report(f"copying {parent.ref}", 0.03)
            shutil.copytree(parent.host_dir or "", work, symlinks=True, dirs_exist_ok=True)
            make_writable(work)
            os.unlink(os.path.join(work, MANIFEST))
            reset_interpreter(work, python)  # the parent's packages may have replaced bin/python
        else:
            report(f"creating venv from {python}", 0.03)
            venv = subprocess.run([python, "-m", "venv", "--without-pip", work],  # noqa: S603
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if venv.returncode != 0:
                tail = "\n".join(venv.stdout.decode(errors="replace").strip().splitlines()[-8:])
                raise rt.RuntimeNotUsable(f"{python} -m venv failed (exit {venv.returncode}); nothing was "
                                          f"published:\n{tail}", details={"step": "venv"})
        if pip or npm:  # in a jail box with the index hosts only; never on the host (build_box.py)
            report("starting the build box", 0.08)
            install_in_box(work, pip, npm, python=python, index_url=index_url, registry=registry, report=report)
            shutil.rmtree(os.path.join(work, NPM_CACHE), ignore_errors=True)
            reset_interpreter(work, python)  # a wheel's *.data/scripts/python or data/pyvenv.cfg
        if pip:
            report("building matplotlib's font cache", 0.93)
            skipped = font_cache(work)
            if skipped:
                report(f"font cache skipped: {skipped}"[:80], 0.94)
        report("writing manifest", 0.95)
        info = {"name": name, "python": python, "packages": [*(parent.packages if parent else []), *pip],
                "npm": [*(parent.npm if parent else []), *npm], "from": parent.ref if parent else None,
                "pip_index": index_url, "npm_registry": registry, "installed_at": time.time()}
        with open(os.path.join(work, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(info, f, indent=1)
        _read_only(work)
        if docker is not None:
            from .runtime_docker import build_image

            report("building the Docker image", 0.96)
            env = Runtime(name, "", work, info["packages"], info["npm"]).env()
            temp_tag = build_image(docker, work, name, f"execbox/runtime-{name}:build-{os.getpid()}", env)
        version = publish(top, work)
        if temp_tag:
            from .runtime_docker import image_name, retag

            retag(docker, temp_tag, image_name(name, version))
            temp_tag = None
        report(f"{name}@{version} ready", 1.0)
    except BaseException:
        make_writable(work)
        shutil.rmtree(work, ignore_errors=True)
        if temp_tag:
            try:
                docker.images.remove(temp_tag)
            except Exception:  # noqa: BLE001 - best effort: a leftover build tag is harmless
                pass
        raise
    finally:
        os.close(held)
    return rt.resolve(f"{name}@{version}")


def new_build_dir(top: str) -> tuple[str, int]:
    """A fresh ``.build-*`` directory in ``top`` and the fd holding its lock (close it when the
    build ends: until then no other build takes it for abandoned); abandoned ones go first."""
    remove_abandoned_builds(top)
    work = tempfile.mkdtemp(prefix=".build-", dir=top)
    held = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(held, fcntl.LOCK_EX)
    return work, held


ABANDONED_AFTER = 60.0
"""Seconds a ``.build-*`` directory must have existed before another build may take it for abandoned."""


def remove_abandoned_builds(top: str) -> list[str]:
    """Remove the ``.build-*`` directories of builds that were killed (a killed build cannot
    clean up; each can hold hundreds of MB). A running build holds a lock on its directory, so
    only an unlocked one older than ABANDONED_AFTER goes (not one another build has just made
    and is about to lock). Returns the names removed."""
    removed = []
    try:
        names = [n for n in os.listdir(top) if n.startswith(".build-")]
    except OSError:
        return removed
    for n in names:
        path = os.path.join(top, n)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if time.time() - os.fstat(fd).st_mtime < ABANDONED_AFTER:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its build is running
            make_writable(path)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(n)
            log.info("runtime build: removed %s, left by a build that was killed", path)
        finally:
            os.close(fd)
    return removed


def font_cache(work: str) -> str | None:
    """matplotlib's font list for a version that has matplotlib, in ``<version>/mpl-seed``.

    Made by the version's own matplotlib inside a jail box without network, where the version is
    mounted where boxes see it (build_isolation.font_lists_in_box): importing matplotlib runs
    package code, which never happens on the host. No matplotlib: nothing. Returns why it was
    skipped when no box can start here (boxes then scan the fonts on their first plot), else None.
    """
    if not has_matplotlib(work):
        return None
    try:
        lists = font_lists_in_box(work)
    except NoBox as e:
        log.warning("runtime build: no font cache for %s, no jail box can start here: %s", work, e)
        return f"no jail box can start here ({e})"
    seed = os.path.join(work, rt.MPL_SEED)
    shutil.rmtree(seed, ignore_errors=True)  # a --from parent's: this version's matplotlib may differ
    if lists:
        os.mkdir(seed, 0o755)
        for name, text in lists.items():
            with open(os.path.join(seed, name), "w", encoding="utf-8") as f:
                f.write(text)
    return None


def publish(top: str, work: str) -> str:
    """Rename the finished build to the next ``v<N>`` (never one the name had before, also after
    ``rm NAME``) and point ``current`` at it; all or nothing, SB002 when it fails
    (runtime_publish.py).

    Public for tools that lay out a version themselves (scripts/device_runtime_from_venv.py).
    """
    from .runtime_publish import publish as publish_version

    return publish_version(top, work)


def _read_only(root: str) -> None:
    """World-readable, nobody-writable (the box's uid reads it; a version never changes)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for fn in filenames:
            p = os.path.join(dirpath, fn)
            if not os.path.islink(p):
                os.chmod(p, (os.stat(p).st_mode | 0o444) & ~0o222)
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p):
                os.chmod(p, 0o555)
    os.chmod(root, 0o555)


def make_writable(root: str) -> None:
    if not os.path.isdir(root):
        return
    for dirpath, dirnames, _files in os.walk(root):
        os.chmod(dirpath, 0o755)
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p):
                os.chmod(p, 0o755)
