"""execbox: run untrusted Python, JavaScript and bash in isolated per-tenant workspaces.

Public API (imported lazily so that ``import execbox.agent`` stays stdlib-only and fast):
``execute_code``, ``Sandbox``, ``get_sandbox``, the models and the SB error classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "execute_code": "api", "Sandbox": "api", "get_sandbox": "api", "Files": "api",
    "ExecutionResult": "models", "SandboxInstance": "models", "Artifact": "models", "Language": "models",
    "Isolation": "models", "FileInfo": "models", "TextPage": "models", "GrepMatch": "models",
    "SandboxError": "errors", "ProviderNotInitializedError": "errors", "InvalidConfigError": "errors",
    "ConnectionFailedError": "errors", "InstanceCreationError": "errors", "ExecutionTimeoutError": "errors",
    "OutOfMemoryError": "errors", "CodeBlockedError": "errors", "RateLimitError": "errors",
    "ProviderUnavailableError": "errors",
    "SandboxProvider": "providers.base",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from .api import Files, Sandbox, execute_code, get_sandbox  # noqa: F401
    from .errors import *  # noqa: F403
    from .models import *  # noqa: F403
    from .providers.base import SandboxProvider  # noqa: F401


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'execbox' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
