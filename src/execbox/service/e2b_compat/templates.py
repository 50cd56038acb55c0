"""E2B template -> execbox runtime: the one place that decides what a ``templateID`` means.

The SDKs' default templates (``base`` for ``e2b``, ``code-interpreter-v1`` for
``e2b-code-interpreter``) run on the active provider as configured. On the jail provider a
template may also name an installed jail runtime (``execbox runtime list``): it is accepted when
it is the runtime the provider runs. Sessions cannot pick their own runtime yet (issue 14's
runtime templates), so another installed runtime is refused with 400 saying so; anything else
is 404 "template not found", which the SDK raises as its own SandboxException (status 404).
"""

from __future__ import annotations

from typing import Any

DEFAULT_TEMPLATES = frozenset({"base", "code-interpreter-v1", "code-interpreter", "code-interpreter-beta"})


class TemplateRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _name(template: str) -> str:
    """``team/name:tag`` -> ``name`` (E2B's template references)."""
    return template.rsplit("/", 1)[-1].split(":", 1)[0].strip().lower()


def runtime_for(template: str, provider: Any) -> str | None:
    """The execbox runtime ``template`` runs on (None: the provider's configured default)."""
    name = _name(template)
    if name in DEFAULT_TEMPLATES:
        return None
    if getattr(provider, "name", "") == "jail":
        from ...boxes import runtime

        configured = str((getattr(provider, "config", None) or {}).get("runtime") or runtime.SYSTEM)
        installed = {str(r["name"]) for r in runtime.list_runtimes()}
        if name == configured:
            return name
        if name in installed:
            raise TemplateRefused(400, f"template {template!r} is the jail runtime {name!r}, but this server's "
                                       f"jail provider runs {configured!r}; per-sandbox runtimes are not "
                                       "supported yet (use the default template or reconfigure the provider)")
    raise TemplateRefused(404, f"template {template!r} not found (execbox serves "
                               f"{', '.join(sorted(DEFAULT_TEMPLATES))} and the active jail runtime)")
