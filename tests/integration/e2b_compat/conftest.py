"""Fixtures for the official E2B SDKs against a real `execbox serve` (tests/e2b_server.py's
``e2b_server``): tests point E2B_API_URL and E2B_SANDBOX_URL at the server and use a token as
E2B_API_KEY, exactly as a user would.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.e2b_server import RUNTIME, SANDBOX_DOMAIN, Server

__all__ = ["RUNTIME", "SANDBOX_DOMAIN", "Server"]


@pytest.fixture
def e2b_env(e2b_server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    """The two environment variables of docs/e2b-compat.md, plus tenant alpha's key."""
    monkeypatch.setenv("E2B_API_URL", e2b_server.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", e2b_server.url)
    monkeypatch.setenv("E2B_API_KEY", e2b_server.token_a)
    for name in ("E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return e2b_server


@contextmanager
def module_sandbox(server: Server, create: Callable[[], Any]) -> Iterator[Any]:
    """A sandbox for a module-scoped fixture: ``create()`` runs with the SDK pointed at ``server``
    (tenant alpha), and the sandbox is killed afterwards."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("E2B_API_URL", server.url)
        mp.setenv("E2B_SANDBOX_URL", server.url)
        mp.setenv("E2B_API_KEY", server.token_a)
        sandbox = create()
        try:
            yield sandbox
        finally:
            sandbox.kill()


def kill_box(sandbox) -> None:  # noqa: ANN001
    """SIGKILL every process of the sandbox's box, found by a marker file in its /workspace."""
    marker = f".box-of-{sandbox.sandbox_id}"
    sandbox.files.write(f"/home/user/{marker}", "x")
    pids = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.path.exists(f"/proc/{name}/root/workspace/{marker}"):
                pids.append(int(name))
        except OSError:
            pass
    assert pids, "the sandbox's box was not found"
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") and not _zombie(pid) for pid in pids):
        assert time.monotonic() < deadline, "the box did not die"
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
