"""Fixtures for jail tests: a real JailProvider (real bwrap, cgroups, seccomp) per module."""

from __future__ import annotations

import os
import time

import pytest

from tests.conftest import require

SMALL = {"max_memory": "256m", "disk_quota_mb": 32, "pids_limit": 64, "cpus": 1.0, "pool_size": 0,
         "preload": "none"}


def jail_ready() -> None:
    from execbox.providers.jail import JailProvider

    ok, reason = JailProvider.availability()
    require(ok, f"bubblewrap jail ({reason})")


def cgroups_ready() -> None:
    """Skip, naming the missing piece, where boxes get no cgroup (the jail runs degraded: a host
    that does not delegate memory, pids and cpu to execbox's cgroup; `execbox doctor` says so)."""
    from execbox.boxes import cgroups

    try:
        cgroups.detect()
    except cgroups.CgroupUnavailable as e:
        require(False, f"cgroup limits for boxes ({e})")


def make_provider(**overrides):
    from execbox.providers.jail import JailProvider

    jail_ready()
    p = JailProvider()
    p.initialize({**SMALL, **overrides})
    return p


@pytest.fixture(scope="module")
def jail():
    p = make_provider()
    yield p
    p.shutdown()


@pytest.fixture
def box(jail):
    """A fresh instance of the module's provider; destroyed after the test."""
    inst = jail.create_instance()
    yield inst.instance_id
    jail.destroy_instance(inst.instance_id)


def run(provider, instance_id: str, code: str, language: str = "python", timeout: float = 20, **kw):
    return provider.execute_code(instance_id, code, language, timeout, **kw)


def assert_healthy(provider, instance_id: str | None = None) -> None:
    """After an attack, a normal run still works (in the same box if it survived, else a new one)."""
    if instance_id is not None and provider.instance_alive(instance_id):
        r = run(provider, instance_id, "print(6 * 7)")
        assert (r.exit_code, r.stdout) == (0, "42\n"), r
    inst = provider.create_instance()
    try:
        r = run(provider, inst.instance_id, "print(6 * 7)")
        assert (r.exit_code, r.stdout) == (0, "42\n"), r
    finally:
        provider.destroy_instance(inst.instance_id)


def wait_for(cond, timeout: float = 10.0, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


def pids_alive(pids: list[int]) -> list[int]:
    return [p for p in pids if os.path.exists(f"/proc/{p}")]
