"""Real dockerd (runc and runsc) for the docker provider's tests: one warm provider per runtime.

The engine itself comes from the session fixture ``docker_engine`` (tests/docker_engine.py).
"""

from __future__ import annotations

import pytest

from tests.conftest import require


def runtimes_of(client) -> set[str]:
    return set(client.info().get("Runtimes") or {})


_providers: dict[str, object] = {}


@pytest.fixture(scope="session", params=["runc", "runsc"])
def provider(request, docker_engine):
    """One warm provider per runtime, shared by the suite (container start-up is the slow part)."""
    runtime = request.param
    require(runtime in runtimes_of(docker_engine), f"docker runtime {runtime}")
    from execbox.providers.docker import DockerProvider

    p = DockerProvider()
    # runsc at the default 512m: below it gVisor boxes preload nothing (providers/preload.py), and the
    # suite should run the default preloaded agent under gVisor too
    p.initialize({"runtime": runtime, "pool_size": 2, "pool_wait": 120,
                  "max_memory": "512m" if runtime == "runsc" else "256m",
                  "pids_limit": 64, "cpus": 1.0, "timeout": 30})
    yield p
    p.shutdown()


@pytest.fixture
def instance(provider):
    inst = provider.create_instance(tenant_id="t1", session_id="s1")
    yield inst.instance_id
    provider.destroy_instance(inst.instance_id)
