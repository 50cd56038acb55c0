"""One initialized provider per conformance id, each on its real component (or the cloud fakes).

A provider whose component is missing skips naming it (it fails in CI, where `make test` installs
everything); providers are session-scoped because box start-up is the slow part.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import require
from tests.integration.docker.conftest import runtimes_of
from tests.integration.kubernetes.conftest import fake_apiserver  # noqa: F401 - fixture
from tests.integration.remote.conftest import executor_server, server_provider  # noqa: F401 - fixtures
from tests.unit.remote.http_server import ThreadedServer

from .capabilities import KINDS, PROVIDERS, declared

MEMORY = "256m"


def _jail() -> Any:
    from execbox.boxes.runtime import list_runtimes
    from execbox.providers.jail import JailProvider

    ok, reason = JailProvider.availability()
    require(ok, f"bubblewrap jail ({reason})")
    require(any(r["name"] == "sci" for r in list_runtimes()),  # either layout (legacy or versioned)
            "jail runtime 'sci' (scripts/setup/test/20-jail-runtime.sh)")
    p = JailProvider()
    p.initialize({"pool_size": 1, "max_memory": MEMORY, "pids_limit": 64, "preload": "none", "runtime": "sci",
                  "timeout": 30})
    return p


def _docker(request: pytest.FixtureRequest, runtime: str) -> Any:
    engine = request.getfixturevalue("docker_engine")
    require(runtime in runtimes_of(engine), f"docker runtime {runtime}")
    from execbox.providers.docker import DockerProvider

    p = DockerProvider()
    # preload none, as the jail's: the contract does not depend on it, and under gVisor every forked
    # context of a fully preloaded agent (matplotlib included) holds ~50 MB of the box's MEMORY
    p.initialize({"runtime": runtime, "pool_size": 1, "pool_wait": 120, "max_memory": MEMORY, "pids_limit": 64,
                  "cpus": 1.0, "timeout": 30, "preload": "none"})
    return p


def _kubernetes(request: pytest.FixtureRequest) -> Any:
    """Pods through the in-test API server: each a real runc container of the worker image."""
    from execbox.providers.kubernetes import KubernetesProvider
    from tests.integration.kubernetes.conftest import provider_config

    p = KubernetesProvider()
    p.initialize(provider_config(request.getfixturevalue("fake_apiserver"), pool_size=1, pool_wait=120, memory="256Mi",
                         timeout=30, sweep_interval=5))
    return p


def _self_managed(request: pytest.FixtureRequest, api: str) -> Any:
    """api "run": RAGFlow's /run contract on execbox's executor; "execbox": a real `execbox serve`
    (jail, sci runtime) through its own sandbox API, admin token so sessions are deleted."""
    from execbox.providers.self_managed import SelfManagedProvider

    p = SelfManagedProvider()
    if api == "run":
        srv = request.getfixturevalue("executor_server")
        p.initialize({"endpoint": srv.url, "timeout": 30, "max_retries": 0})
    else:
        srv = request.getfixturevalue("e2b_server")
        p.initialize({"endpoint": srv.url, "timeout": 30, "max_retries": 0, "api": "execbox",
                      "api_key": srv.admin_token})
    return p


def _e2b(stack: list[Any]) -> Any:
    from e2b.sandbox_sync.commands.command import Commands

    from execbox.providers.e2b import E2BProvider
    from tests.unit.remote.fake_e2b import FakeE2B, create_fake_e2b_app, fake_commands_run

    state = FakeE2B()
    srv = ThreadedServer(create_fake_e2b_app(state)).start()
    mp = pytest.MonkeyPatch()
    for var in ("E2B_API_KEY", "E2B_DOMAIN", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_DEBUG"):
        mp.delenv(var, raising=False)
    mp.setattr(Commands, "run", fake_commands_run(state))
    stack.extend([mp.undo, srv.stop, state.cleanup])
    p = E2BProvider()
    # max_memory as on e2b-execbox: the agent's limit makes a bomb the run's MemoryError (SB006) in the fake too
    p.initialize({"api_key": state.api_key, "api_url": srv.url, "sandbox_url": srv.url, "timeout": 30,
                  "max_memory": MEMORY})
    return p


def _e2b_execbox(request: pytest.FixtureRequest) -> Any:
    """The e2b provider against execbox's own E2B-compatible endpoint: no fake in between."""
    from execbox.providers.e2b import E2BProvider

    srv = request.getfixturevalue("e2b_server")
    p = E2BProvider()
    # max_memory under the box's 512m cgroup: a bomb is the run's MemoryError (SB006), not the box's OOM kill
    p.initialize({"api_key": srv.token_a, "api_url": srv.url, "sandbox_url": srv.url, "timeout": 30,
                  "max_memory": "256m"})
    return p


def _aliyun(stack: list[Any]) -> Any:
    from execbox.providers.aliyun import AliyunCodeInterpreterProvider
    from tests.unit.remote.fake_agentrun import FakeAgentRun, create_fake_agentrun_app, install_fake_control_plane

    state = FakeAgentRun()
    srv = ThreadedServer(create_fake_agentrun_app(state)).start()
    mp = pytest.MonkeyPatch()
    mp.setenv("DISABLE_BREAKING_CHANGES_WARNING", "1")
    install_fake_control_plane(state, mp)
    stack.extend([mp.undo, srv.stop, state.cleanup])
    p = AliyunCodeInterpreterProvider()
    p.initialize({"access_key_id": state.access_key_id, "access_key_secret": state.access_key_secret,
                  "account_id": state.account_id, "data_endpoint": srv.url, "timeout": 30})
    return p


@pytest.fixture(scope="module", params=PROVIDERS)
def conformance_provider(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    name = request.param
    stack: list[Any] = []
    if name == "local":
        from execbox.providers.local import LocalProvider

        p: Any = LocalProvider()
        p.initialize({"max_memory": "1g", "timeout": 30})
    elif name == "jail":
        p = _jail()
    elif name.startswith("docker-"):
        p = _docker(request, name.split("-", 1)[1])
    elif name == "kubernetes":
        p = _kubernetes(request)
    elif name == "self_managed":
        p = _self_managed(request, "execbox")
    elif name == "self_managed-run":
        p = _self_managed(request, "run")
    elif name == "e2b":
        p = _e2b(stack)
    elif name == "e2b-execbox":
        p = _e2b_execbox(request)
    elif name == "aliyun":
        p = _aliyun(stack)
    else:
        raise AssertionError(name)
    yield name, p
    p.shutdown()
    for undo in reversed(stack):
        undo()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A declared case runs as a strict xfail (it must fail: a stale declaration fails the suite);
    one that would harm the host, or that a known race makes pass or fail by timing, is skipped."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "case" not in params or "conformance_provider" not in params:
            continue
        name, case = params["conformance_provider"], params["case"]
        decl = declared(name, case)
        if decl is None:
            continue
        why = f"{name} declares {case} {KINDS[decl.kind]}: {decl.reason}"
        if decl.harms_host or decl.racy:
            item.add_marker(pytest.mark.skip(reason=why))
        else:
            item.add_marker(pytest.mark.xfail(strict=True, reason=why))
