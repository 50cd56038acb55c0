"""The one real-dockerd session fixture, shared by every suite that needs the engine.

Registered once from tests/conftest.py (``pytest_plugins``): a session fixture defined in several
conftests runs once per definition, and each copy's end-of-session check would then see the other
suites' still-running boxes as leaks. It runs scripts/setup/test/40-docker.sh when the engine does
not answer (installs docker.io + runsc, registers runsc, starts dockerd), builds the worker image
once (cached under /var/cache/execbox/images), and checks at the very end that nothing labelled by
this process is left behind.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.conftest import require

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    from execbox.boxes.docker_owner import OWNER_LABEL, owner_id
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
    me = f"{OWNER_LABEL}={owner_id()}"
    deadline = time.monotonic() + 30
    while True:
        left = client.containers.list(all=True, filters={"label": me}, ignore_removed=True)
        vols = client.volumes.list(filters={"label": me})
        if not (left or vols) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # Whatever is left is removed (so the next run starts clean) and fails the run, naming the
    # test that built the provider it came from.
    labels = [c.labels or {} for c in left] + [v.attrs.get("Labels") or {} for v in vols]
    sources = sorted({created_by.get(lb.get(PROVIDER_LABEL, ""), "a provider built before the engine fixture")
                      for lb in labels})
    for obj in [*left, *vols]:
        try:
            obj.remove(force=True)
        except Exception:  # noqa: BLE001 - gone meanwhile
            pass
    client.close()
    assert not left and not vols, (f"left behind: {[c.name for c in left]} {[v.name for v in vols]}, "
                                   f"by providers built in {sources}")
