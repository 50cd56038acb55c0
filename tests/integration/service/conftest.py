"""A real execbox service on a loopback port: uvicorn in a thread, a temp store, the jail provider.

``service_factory(**settings)`` starts one more app with its own settings (limits, idle timeout)
on the shared jail provider; every app is shut down at the end of its test module.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn

from execbox.providers.base import SandboxProvider
from execbox.service.app import create_app
from execbox.service.config import ServiceSettings
from execbox.service.store import open_store
from tests.conftest import require


class Holder:
    """The ``providers`` object of a test app: one initialized provider."""

    def __init__(self, provider: SandboxProvider) -> None:
        self.provider = provider

    def current(self) -> SandboxProvider:
        return self.provider

    def candidates(self) -> list[SandboxProvider]:
        return [self.provider]


@dataclass
class Service:
    url: str
    app: Any
    store: Any
    admin: str
    tenant_a: str
    tenant_b: str
    server: uvicorn.Server
    thread: threading.Thread
    workspaces: str
    clients: list[httpx.Client] = field(default_factory=list)

    def client(self, token: str | None = None, **kw: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        c = httpx.Client(base_url=self.url, headers=headers, timeout=kw.pop("timeout", 60), **kw)
        self.clients.append(c)
        return c

    @property
    def a(self) -> httpx.Client:
        return self.client(self.tenant_a)

    @property
    def b(self) -> httpx.Client:
        return self.client(self.tenant_b)

    @property
    def root(self) -> httpx.Client:
        return self.client(self.admin)

    def jail_instances(self, *instance_ids: str) -> list[str]:
        """Which of these instances the provider still holds (a one-shot's must be gone)."""
        provider = self.app.state.services.providers.current()
        live = {i.instance_id for i in provider.list_instances()}
        return [i for i in instance_ids if i in live]

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        self.server.should_exit = True
        self.thread.join(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def traversable_tmpdir(prefix: str) -> str:
    """Jail boxes run as an unprivileged uid: every ancestor of a workspace must be traversable."""
    d = tempfile.mkdtemp(prefix=prefix)
    os.chmod(d, 0o711)
    return d


def registry_workspaces(workspaces_dir: str, data_dir: str) -> str:
    """<workspaces dir>/<registry id>: where a service on the store in ``data_dir`` keeps its
    session workspaces (one directory per registry, so services sharing a dir never collide)."""
    with open_store(data_dir=data_dir) as store:
        return os.path.join(workspaces_dir, store.sessions.identity())


def start_service(provider: Any, settings: ServiceSettings | None = None, **app_kw: Any) -> Service:
    base = traversable_tmpdir("execbox-svc-")
    workspaces = os.path.join(base, "ws")
    store = open_store(data_dir=os.path.join(base, "data"))
    _, admin = store.tokens.create("ops", role="admin")
    _, ta = store.tokens.create("tenant-a")
    _, tb = store.tokens.create("tenant-b")
    settings = settings or ServiceSettings()
    settings = settings.with_(workspaces_dir=settings.workspaces_dir or workspaces)
    # None: production wiring (ProviderManager over the store, hot-reloaded from the admin API)
    providers = None if provider is None else provider if hasattr(provider, "current") else Holder(provider)
    app = create_app(store=store, providers=providers, settings=settings, **app_kw)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    return Service(f"http://127.0.0.1:{port}", app, store, admin, ta, tb, server, thread,
                   app.state.services.sessions.workspaces_root)


@pytest.fixture(scope="session")
def jail_provider() -> Iterator[SandboxProvider]:
    from execbox.providers.jail import JailProvider

    ok, reason = JailProvider.availability()
    require(ok, f"bubblewrap jail ({reason})")
    p = JailProvider()
    p.initialize({"pool_size": 2, "max_memory": "256m", "preload": "none"})
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def service(jail_provider: SandboxProvider) -> Iterator[Service]:
    svc = start_service(jail_provider)
    yield svc
    svc.stop()


@pytest.fixture
def service_factory(jail_provider: SandboxProvider) -> Iterator[Any]:
    started: list[Service] = []

    def make(provider: Any = jail_provider, **settings: Any) -> Service:
        svc = start_service(provider, ServiceSettings(**settings))
        started.append(svc)
        return svc

    yield make
    for svc in started:
        svc.stop()


@contextmanager
def slots_taken(sessions: Any, tenant_id: str, n: int = 1) -> Iterator[None]:
    """``n`` of the tenant's execution slots held by another thread, as runs in progress hold them,
    while the body runs."""
    held, release = threading.Event(), threading.Event()

    def busy() -> None:
        with ExitStack() as stack:
            for _ in range(n):
                stack.enter_context(sessions.execution_slot(tenant_id))
            held.set()
            release.wait(120)

    t = threading.Thread(target=busy)
    t.start()
    try:
        assert held.wait(10)
        yield
    finally:
        release.set()
        t.join()


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The error object of an SB error response (asserting the one JSON shape)."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details"}, body
    return body["error"]
