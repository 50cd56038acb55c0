"""Real dockerd (runc and runsc) for the docker provider's tests.

The session fixture runs scripts/setup/test/40-docker.sh when the engine does not answer (it
installs docker.io + runsc, registers runsc and starts dockerd), builds the worker image once
(cached under /var/cache/execbox/images), and checks that nothing labelled by this process is
left behind after the suite.
"""

from __future__ import annotations

import os
import subprocess
import time
import warnings

import pytest

from tests.conftest import require

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SETUP = os.path.join(REPO, "scripts", "setup", "test", "40-docker.sh")


def _engine():
    try:
        import docker
    except ImportError:
        return None
    try:
        client = docker.from_env(timeout=10)
        client.ping()
        return client
    except Exception:  # noqa: BLE001
        return None


@pytest.fixture(scope="session")
def docker_engine():
    client = _engine()
    if client is None and os.geteuid() == 0 and os.path.exists(SETUP):
        subprocess.run(["bash", SETUP], check=False, timeout=900)  # noqa: S603,S607
        client = _engine()
    require(client is not None, "dockerd (docker.io)")
    from execbox.boxes import images

    spec = images.image_for("python")
    if images.cached_image(client, spec) is None:
        require(os.geteuid() == 0 and images.shutil.which("debootstrap") is not None,
                "debootstrap (to build the worker image)")
        images.build_image(client, spec)
    from execbox.providers.docker import PROVIDER_LABEL, DockerProvider

    created_by: dict[str, str] = {}  # provider uid -> the test that built it, to name a leak's source
    original_init = DockerProvider.__init__

    def recording_init(self) -> None:
        original_init(self)
        created_by[self.uid] = os.environ.get("PYTEST_CURRENT_TEST", "?")

    DockerProvider.__init__ = recording_init  # type: ignore[method-assign]
    try:
        yield client
    finally:
        DockerProvider.__init__ = original_init  # type: ignore[method-assign]
    from execbox.providers.docker import OWNER_LABEL, owner_id

    me = f"{OWNER_LABEL}={owner_id()}"
    deadline = time.monotonic() + 30
    while True:
        left = client.containers.list(all=True, filters={"label": me}, ignore_removed=True)
        vols = client.volumes.list(filters={"label": me})
        if not (left or vols) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # Unused warm-pool spares (never handed to user code) left by a provider that was not shut
    # down in order are removed and reported; any other leftover (a session or one-shot box) fails.
    spares = [c for c in left if (c.labels or {}).get("execbox.pooled") == "true"
              and not (c.labels or {}).get("execbox.session")]
    if spares:
        names = {c.name for c in spares}
        sources = sorted({created_by.get((c.labels or {}).get(PROVIDER_LABEL, ""), f"? {c.labels}") for c in spares})
        warnings.warn(f"removed unused warm-pool containers left behind: {sorted(names)}, by providers "
                      f"built in {sources}", stacklevel=1)
        for c in spares:
            c.remove(force=True, v=True)
        vols = [v for v in vols if v.name.replace("execbox-ws-", "execbox-", 1) not in names]
        for v in client.volumes.list(filters={"label": me}):
            if v.name.replace("execbox-ws-", "execbox-", 1) in names:
                v.remove(force=True)
        left = [c for c in left if c.name not in names]
    client.close()
    assert not left and not vols, f"left behind: {[c.name for c in left]} {[v.name for v in vols]}"


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
    p.initialize({"runtime": runtime, "pool_size": 2, "pool_wait": 120, "max_memory": "256m",
                  "pids_limit": 64, "cpus": 1.0, "timeout": 30})
    yield p
    p.shutdown()


@pytest.fixture
def instance(provider):
    inst = provider.create_instance(tenant_id="t1", session_id="s1")
    yield inst.instance_id
    provider.destroy_instance(inst.instance_id)
