"""Shared fixtures. Area-specific fixtures live in each test folder's conftest.py."""

from __future__ import annotations

import os
import shutil

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
