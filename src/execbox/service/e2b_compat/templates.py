"""E2B template -> execbox runtime: the one place that decides what a ``templateID`` means.

The SDKs' default templates (``base`` for ``e2b``, ``code-interpreter-v1`` for
``e2b-code-interpreter``) run on the active provider as configured. On the jail provider a
template may also name a runtime template (``execbox runtime list``; ``NAME`` or ``NAME@vN``):
the one the provider runs is its default, any other installed one becomes the sandbox session's
runtime (issue 14's per-session runtimes). Anything else is 404 "template not found", which the
SDK raises as its own SandboxException (status 404).
"""

from __future__ import annotations

from typing import Any

from .sandbox_http import clip

DEFAULT_TEMPLATES = frozenset({"base", "code-interpreter-v1", "code-interpreter", "code-interpreter-beta"})


class TemplateRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _name(template: str) -> str:
    """``team/name:tag`` -> ``name`` (E2B's template references; ``@vN`` runtime pins are kept)."""
    return template.rsplit("/", 1)[-1].split(":", 1)[0].strip().lower()


def runtime_for(template: str, provider: Any) -> str | None:
    """The runtime template the sandbox's session runs (None: the provider's configured default)."""
    name = _name(template)
    if name in DEFAULT_TEMPLATES:
        return None
    if getattr(provider, "name", "") == "jail":
        from ...boxes import runtime

        configured = str((getattr(provider, "config", None) or {}).get("runtime") or runtime.SYSTEM)
        if name == configured:
            return None
        base = name.split("@", 1)[0]
        installed = {str(r["name"]) for r in runtime.list_runtimes()}
        if base in installed:
            return name
    raise TemplateRefused(404, f"template {clip(template)!r} not found (execbox serves "
                               f"{', '.join(sorted(DEFAULT_TEMPLATES))} and installed jail runtimes)")
