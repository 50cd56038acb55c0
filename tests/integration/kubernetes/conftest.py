"""Fixtures for the kubernetes provider: an in-test API server whose pods are real containers.

``fake_apiserver`` (session) runs pods as Docker containers of the cached worker image (runc);
``provider_config(fake, **overrides)`` is a provider config pointing at it (tests/conformance/
builds its provider with it); ``k8s_provider_factory`` initialises providers per test and checks
that every pod they started is gone afterwards; ``kubernetes_provider`` is one session-wide
provider (warm pool of 2) for other suites.
"""

from __future__ import annotations

import importlib.util
import time

import pytest

from execbox.boxes import k8s_spec as ks
from tests.conftest import require

SECRET = "k8s-test-secret-0123456789abcdef"


@pytest.fixture(scope="session")
def fake_apiserver(docker_engine, tmp_path_factory):
    require(importlib.util.find_spec("kubernetes") is not None,
            "the kubernetes client (pip install 'execbox[kubernetes]')")
    from tests.integration.kubernetes.fake_apiserver import FakeApiServer

    require("runc" in (docker_engine.info().get("Runtimes") or {}), "docker runtime runc")
    fake = FakeApiServer(docker_engine)
    fake.kubeconfig_path = fake.kubeconfig(str(tmp_path_factory.mktemp("kube") / "config"))
    yield fake
    fake.close()


def _reset(fake) -> None:
    fake.forbidden.clear()
    fake.delay = 0.0
    fake.hold_pending = False
    fake.release_deletes()
    fake.not_ready.clear()
    fake.network_policies.clear()


def provider_config(fake, **config):
    return {"kubeconfig": fake.kubeconfig_path, "agent_secret": SECRET, "pool_size": 0, "pool_wait": 60,
            "ready_timeout": 60, "api_timeout": 5, "sweep_interval": 0.5, "preload": "none", "memory": "256Mi",
            **config}


def _pods_of(fake, providers) -> list[str]:
    owners = {p.owner for p in providers}
    return [n for n in fake.pod_names()
            if ((fake.pod(n) or {}).get("metadata", {}).get("annotations") or {}).get(ks.A_OWNER) in owners]


def _shutdown_and_check(fake, providers) -> None:
    for p in providers:
        p.shutdown()
    deadline = time.monotonic() + 20
    while _pods_of(fake, providers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _pods_of(fake, providers)
    for name in left:  # keep the next test clean even when this one failed
        fake.delete_pod("execbox-sandboxes", name)
    assert not left, f"pods left behind: {left}"


@pytest.fixture
def k8s_provider_factory(fake_apiserver):
    """Build initialised providers against the fake; every pod they started must be gone after."""
    from execbox.providers.kubernetes import KubernetesProvider

    made = []

    def make(**config):
        p = KubernetesProvider()
        p.initialize(provider_config(fake_apiserver, **config))
        made.append(p)
        return p

    _reset(fake_apiserver)
    yield make
    _reset(fake_apiserver)
    _shutdown_and_check(fake_apiserver, made)


@pytest.fixture(scope="session")
def kubernetes_provider(fake_apiserver):
    """One initialised kubernetes provider (warm pool of 2) whose pods really run, shared by a session:
    for shared suites such as tests/conformance/ (pod start-up is the slow part)."""
    from execbox.providers.kubernetes import KubernetesProvider

    p = KubernetesProvider()
    p.initialize(provider_config(fake_apiserver, pool_size=2, pool_wait=120, sweep_interval=5))
    yield p
    _shutdown_and_check(fake_apiserver, [p])


def pod_of(fake, instance_id):
    """The fake API server's pod claimed by ``instance_id`` (its instance annotation), or None."""
    for name in fake.pod_names():
        pod = fake.pod(name)
        if pod and (pod["metadata"].get("annotations") or {}).get(ks.A_INSTANCE) == instance_id:
            return pod
    return None
