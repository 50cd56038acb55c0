"""E2B-compatible endpoint: the unmodified `e2b` / `e2b-code-interpreter` SDKs run against execbox.

``install(app)`` adds the control plane (E2B_API_URL = the server's base URL) and wraps the app so
requests carrying E2B's sandbox routing headers (E2B_SANDBOX_URL = the same base URL) reach envd's
file routes, its process and filesystem Connect services, and the code interpreter. It is a
facade: every operation is a session, run or file call of the same service the HTTP API uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from fastapi import FastAPI
from starlette.requests import Request

from ..errors import BodyTooLarge
from .codecs import strict_codecs
from .control import router
from .creator import TokenLiveness, store_lookup
from .envd_files import EnvdFiles
from .envd_fs import FilesystemService
from .envd_gen.filesystem.filesystem_connect import FilesystemASGIApplication
from .envd_gen.process.process_connect import ProcessASGIApplication
from .envd_process import ProcessService
from .interpreter import Interpreter
from .persist import SandboxStore
from .registry import E2BSandbox, Registry
from .sandbox_http import SandboxRouter

if TYPE_CHECKING:  # pragma: no cover
    from ..container import Services

__all__ = ["install"]


def _bound(handler: Any, sb: E2BSandbox) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        response = await handler(sb, Request(scope, receive))
        await response(scope, receive, send)

    return app


def _connect(service: Any) -> Any:
    """A Connect service whose body over the service's limit (BodyLimit raises BodyTooLarge from
    ``receive``) is a Connect ``resource_exhausted`` error, not one the library calls unknown."""
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def bounded() -> Any:
            try:
                return await receive()
            except BodyTooLarge as e:
                raise ConnectError(Code.RESOURCE_EXHAUSTED, f"SB002: {e.detail}") from None

        await service(scope, bounded, send)

    return app


def install(app: FastAPI, services: Services) -> None:
    """Mount the E2B control plane and the sandbox router on execbox's app (``services.e2b`` set)."""
    creators = TokenLiveness(store_lookup(services.store)) if services.store is not None else None
    store = None
    if services.store is not None and hasattr(services.store, "e2b"):
        settings = services.sandbox_settings
        store = SandboxStore(services.store.e2b, lambda: settings.keyring)
    services.e2b = Registry(services.sessions, creators=creators, store=store)
    if store is not None:  # sandboxes made before a restart (or by other replicas) time out here too
        services.e2b.start()
    process_app = _connect(ProcessASGIApplication(ProcessService(services), codecs=strict_codecs()))
    fs_app = _connect(FilesystemASGIApplication(FilesystemService(services), codecs=strict_codecs()))
    files = EnvdFiles(services)
    interpreter = Interpreter(services)

    def envd(sb: E2BSandbox, scope: dict[str, Any]) -> Any:
        path = scope.get("path", "")
        if path.startswith("/process.Process/"):
            return process_app
        if path.startswith("/filesystem.Filesystem/"):
            return fs_app
        return _bound(files, sb)

    def jupyter(sb: E2BSandbox, scope: dict[str, Any]) -> Any:
        return _bound(interpreter, sb)

    app.include_router(router)
    app.add_middleware(SandboxRouter, registry=services.e2b, envd=envd, jupyter=jupyter)
