"""A real `execbox serve` app (uvicorn on loopback, temp store, jail provider with the `sci` runtime)
for the MCP tests, and helpers that open an MCP client with the SDK's own client classes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.conftest import require
from tests.integration.service.conftest import Service, start_service

pytest.importorskip("mcp", reason="the mcp SDK (a core dependency) is not installed")

import httpx2  # noqa: E402  (installed with mcp)
from mcp.client.client import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402


@pytest.fixture(scope="session")
def sci_jail() -> Iterator[Any]:
    from execbox.boxes.runtime import list_runtimes
    from execbox.providers.jail import JailProvider

    ok, reason = JailProvider.availability()
    require(ok, f"bubblewrap jail ({reason})")
    require(any(r["name"] == "sci" for r in list_runtimes()),  # either layout (legacy or versioned)
            "jail runtime 'sci' (scripts/setup/test/20-jail-runtime.sh)")
    p = JailProvider()
    p.initialize({"pool_size": 1, "max_memory": "512m", "preload": "none", "runtime": "sci"})
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def service(sci_jail: Any) -> Iterator[Service]:
    svc = start_service(sci_jail)
    yield svc
    svc.stop()


@asynccontextmanager
async def http_client(url: str, token: str | None, mode: str = "auto") -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=120) as hc:
        async with Client(streamable_http_client(url + "/mcp", http_client=hc), mode=mode) as client:
            yield client


def run_async(fn: Any, *args: Any) -> Any:
    """anyio.run in a thread of its own (sync Playwright may own the main thread's event loop)."""
    import threading

    import anyio

    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = anyio.run(fn, *args)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            out["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join(300)
    if "error" in out:
        raise out["error"]
    return out.get("value")
