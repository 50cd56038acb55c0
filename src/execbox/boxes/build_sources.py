"""What a template build installed comes from the configured index: the host's checks of the
version after its build box is gone (build_box.py), reading npm's and pip's own records.

* pip: no ``*.dist-info/direct_url.json`` in site-packages that the build added (pip writes one
  for a direct-URL requirement; execbox's guard in the box refuses those before any fetch, so
  this is the second line).
* npm: every entry of ``node_modules/.package-lock.json`` that the build added or changed is a
  registry tarball on the registry's host (``resolved``), reached through a registry version
  range or tag, and no link (``file:`` / ``link:`` dependencies).
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any
from urllib.parse import urlsplit

from .runtime import RuntimeNotUsable


def shown_index(url: str | None) -> str:
    """``scheme://host[:port]/…`` of an index URL (never its path or query)."""
    if not url:
        return ""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/…"


def direct_url_records(work: str) -> set[str]:
    return set(glob.glob(os.path.join(glob.escape(work), "lib", "python3*", "site-packages", "*.dist-info",
                                      "direct_url.json")))


def check_pip_sources(work: str, before: set[str] | frozenset[str] = frozenset()) -> None:
    """SB002 when a distribution this build installed came from a direct URL (pip wrote its
    ``direct_url.json``); ``before``: those already there (a ``--from`` parent's)."""
    found = direct_url_records(work) - set(before)
    if found:
        dist = os.path.basename(os.path.dirname(sorted(found)[0]))[:-len(".dist-info")]
        raise RuntimeNotUsable(f"pip installed {dist} from a direct URL, not from the index; the build was refused",
                               details={"tool": "pip", "dependency": dist, "reason": "direct_url"})


_NPM_RANGE = re.compile(r"(npm:(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*@?)?[A-Za-z0-9.^~<>=*|+ _-]*")
"""A dependency spec that npm resolves against the registry: a version range or tag, or an
``npm:name@range`` alias. URLs, paths, ``file:``/``link:``/``git`` specs and ``user/repo`` have
a ``/`` or ``:`` outside an alias, so they never match."""
MAX_LOCK_BYTES = 64 << 20


def npm_lock(work: str) -> Any:
    """The ``packages`` of npm's record of what it installed (OSError / ValueError when unreadable)."""
    lock_path = os.path.join(work, "node_modules", ".package-lock.json")
    if os.path.islink(lock_path) or os.path.getsize(lock_path) > MAX_LOCK_BYTES:
        raise OSError("not a regular file of sane size")
    with open(lock_path, encoding="utf-8") as f:
        doc = json.load(f)
    return doc.get("packages") if isinstance(doc, dict) else None


def check_npm_sources(work: str, registry: str | None, before: dict[str, Any] | None = None) -> None:
    """SB002 unless every package npm installed is a registry tarball from the registry host,
    reached through a registry version range (npm's own record: ``node_modules/.package-lock.json``).
    ``before``: the record's entries already there (a ``--from`` parent's); unchanged ones pass."""
    try:
        packages = npm_lock(work)
    except (OSError, ValueError) as e:
        raise _npm_refused(f"npm's record of what it installed (node_modules/.package-lock.json) is unreadable: {e}",
                           "node_modules") from None
    if not isinstance(packages, dict):
        raise _npm_refused("npm's record of what it installed has no packages", "node_modules")
    home = urlsplit(registry or "https://registry.npmjs.org/")
    for key, entry in sorted(packages.items(), key=lambda kv: (not str(kv[0]).startswith("node_modules/"), kv[0])):
        if before and key in before and before[key] == entry:
            continue  # the --from parent's, as it was
        name = str(key).rpartition("node_modules/")[2] or str(key)
        if not isinstance(entry, dict):
            raise _npm_refused(f"npm's record of {name} is not an object", name)
        for field in ("dependencies", "optionalDependencies", "peerDependencies"):
            deps = entry.get(field) or {}
            for dep, spec in deps.items() if isinstance(deps, dict) else [(field, deps)]:
                if not isinstance(spec, str) or not _NPM_RANGE.fullmatch(spec):
                    raise _npm_refused(f"npm: {name} depends on {dep}@{str(spec)[:200]!r}, which is not a version "
                                       "from the registry (a URL, path, file: or git dependency)", str(dep))
        resolved = entry.get("resolved")
        if entry.get("link") or not str(key).startswith("node_modules/"):
            raise _npm_refused(f"npm: {name} is a link to {str(resolved or key)[:200]!r} (a file: or link: "
                               "dependency), not a package from the registry", name)
        if resolved is None and entry.get("inBundle"):
            continue  # shipped inside its parent's tarball, which came from the registry
        where = urlsplit(resolved) if isinstance(resolved, str) else None
        if where is None or where.scheme not in ("http", "https") or not _same_host(where, home):
            raise _npm_refused(f"npm: {name} came from {str(resolved)[:200]!r}, not from the registry "
                               f"{shown_index(registry) or 'registry.npmjs.org'}", name)


def _same_host(a: Any, b: Any) -> bool:
    def port(p: Any) -> int:
        return p.port or (443 if p.scheme == "https" else 80)

    return (a.hostname or "") == (b.hostname or "") and port(a) == port(b)


def _npm_refused(message: str, dependency: str) -> RuntimeNotUsable:
    return RuntimeNotUsable(f"{message}; the build was refused", details={"tool": "npm", "dependency": dependency,
                                                                          "reason": "not_from_registry"})
