"""A real executor server for the remote tests: uvicorn on a loopback port, jail when available."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from execbox.providers.base import SandboxProvider
from tests.unit.remote.http_server import ThreadedServer, free_port

__all__ = ["ThreadedServer", "free_port"]


def server_provider_name() -> str:
    """jail when it is installed and usable here, else local (the jail engineer's provider may lag)."""
    from execbox.providers.registry import get_provider_class

    try:
        ok, _ = get_provider_class("jail").availability()
    except Exception:  # noqa: BLE001 - jail not built or not loadable yet
        return "local"
    return "jail" if ok else "local"


@pytest.fixture(scope="session")
def server_provider() -> Iterator[SandboxProvider]:
    from execbox.providers.registry import create_provider

    name = server_provider_name()
    p = create_provider(name, {"timeout": 10, **({"max_memory": "256m"} if name == "jail" else {})})
    yield p
    p.shutdown()


@pytest.fixture(scope="session")
def executor_server(server_provider) -> Iterator[ThreadedServer]:
    from execbox.service.routes.executor_compat import ExecutorAuth, create_executor_app

    app = create_executor_app(server_provider, auth=ExecutorAuth(open=True), owns_provider=False)
    srv = ThreadedServer(app, free_port()).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(executor_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=executor_server.url, timeout=60) as c:
        yield c


def start_executor_process(port: int, *extra: str, provider: str = "local") -> subprocess.Popen:
    """`execbox executor` as its own process (for tests that kill the server)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("EXECBOX_EXECUTOR_TOKEN", None)
    return subprocess.Popen(
        [sys.executable, "-m", "execbox", "executor", "--host", "127.0.0.1", "--port", str(port),
         "--provider", provider, "--log-level", "warning", *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )


def wait_healthy(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"executor at {url} did not become healthy")
