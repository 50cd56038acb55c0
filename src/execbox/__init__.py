"""execbox: run untrusted Python, JavaScript and bash in isolated per-tenant workspaces.

This package root is the public interface (imported lazily so that ``import execbox.agent``
stays stdlib-only and fast): ``execute_code``, ``get_sandbox``, the sandboxes ``Sandbox``
(in-process providers), ``RemoteSandbox`` (an execbox service over HTTP) and their async twins
``AsyncSandbox`` / ``AsyncRemoteSandbox`` (all four with ``files`` and ``commands`` namespaces and
``run_code``), the models and the SB error classes. Their internals live in ``execbox.sdk``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "execute_code": "sdk.local", "Sandbox": "sdk.local", "get_sandbox": "sdk.local", "Files": "sdk.local",
    "AsyncSandbox": "sdk.local_async", "RemoteSandbox": "sdk.remote", "AsyncRemoteSandbox": "sdk.remote_async",
    "CommandHandle": "sdk.commands", "AsyncCommandHandle": "sdk.commands", "ProcessHandle": "sdk.process_handles",
    "AsyncProcessHandle": "sdk.process_handles",
    "ExecutionResult": "models", "SandboxInstance": "models", "Artifact": "models", "Language": "models",
    "Isolation": "models", "FileInfo": "models", "TextPage": "models", "GrepMatch": "models",
    "SandboxError": "errors", "ProviderNotInitializedError": "errors", "InvalidConfigError": "errors",
    "ConnectionFailedError": "errors", "InstanceCreationError": "errors", "ExecutionTimeoutError": "errors",
    "OutOfMemoryError": "errors", "CodeBlockedError": "errors", "RateLimitError": "errors",
    "ProviderUnavailableError": "errors", "SandboxClosedError": "errors",
    "SandboxProvider": "providers.base",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from .errors import *  # noqa: F403
    from .models import *  # noqa: F403
    from .providers.base import SandboxProvider  # noqa: F401
    from .sdk.commands import AsyncCommandHandle, CommandHandle  # noqa: F401
    from .sdk.local import Files, Sandbox, execute_code, get_sandbox  # noqa: F401
    from .sdk.local_async import AsyncSandbox  # noqa: F401
    from .sdk.process_handles import AsyncProcessHandle, ProcessHandle  # noqa: F401
    from .sdk.remote import RemoteSandbox  # noqa: F401
    from .sdk.remote_async import AsyncRemoteSandbox  # noqa: F401


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'execbox' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
