"""Shared fixtures. Area-specific fixtures live in each test folder's conftest.py."""

from __future__ import annotations

import os
import shutil
import time

import pytest

pytest_plugins = ["tests.docker_engine", "tests.e2b_server"]  # one session-wide dockerd / execbox serve for every suite

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, component: str) -> None:
    """Skip naming the missing component, except in CI where every tier must run."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{component} is missing in CI: `make test` should have installed it")
    pytest.skip(f"{component} is not available on this machine")


@pytest.fixture(scope="session")
def node_available() -> bool:
    return shutil.which("node") is not None


@pytest.fixture
def local_provider():
    from execbox.providers.local import LocalProvider

    p = LocalProvider()
    p.initialize({})
    yield p
    p.shutdown()


@pytest.fixture
def local_sandbox(local_provider):
    from execbox import Sandbox

    with Sandbox.create(local_provider) as sb:
        yield sb


def wait_process_exit(p, iid, pid, timeout=20.0) -> tuple[bytes, bytes, dict]:
    """Poll a background process until it has exited: (stdout, stderr, last poll)."""
    out = err = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = p.poll_process(iid, pid, len(out), len(err))
        out += v["stdout"]
        err += v["stderr"]
        if v["exited"]:
            return out, err, v
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not end: {out[-2000:]!r} {err[-2000:]!r}")


def pids_naming(path: str) -> list[int]:
    """Pids of processes whose command line names ``path`` (a jail box by its box dir)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if path.encode() in f.read():
                    out.append(int(pid))
        except OSError:
            pass
    return out
