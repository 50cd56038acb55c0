"""A Docker box that fails to start tells the tenant what failed (SB004, the engine's error class and
HTTP status) but none of the engine's words: they name host paths under the service's data dir,
image names and the daemon's socket. The whole error goes to the server log and to the operator's
own reports (`execbox doctor`, the admin console's provider test), as for the jail (_tenant_safe)."""

from __future__ import annotations

import json
import logging
import socket
import struct
import time
from types import SimpleNamespace

import docker.errors
import pytest
import requests

from execbox.boxes import docker_uid
from execbox.boxes.pool import BoxPool
from execbox.boxes.quota import QuotaUnavailable
from execbox.egress.policy import EgressPolicy
from execbox.errors import BoxStartFailed, InstanceCreationError, operator_message
from execbox.providers import agent_backed
from execbox.providers.docker import DockerProvider

SECRET = "/var/lib/execbox/secret-dir"
IMAGE = "registry.internal:5000/team/secret-image:v7"
SOCKET = "/run/user/0/secret-docker.sock"


def _response(status: int, reason: str) -> requests.Response:
    r = requests.Response()
    r.status_code, r.reason = status, reason
    r.url = f"http+docker://localhost/v1.45/containers/create?name=x&sock={SOCKET}"
    return r


def api_error() -> docker.errors.APIError:
    return docker.errors.APIError(
        "500 Server Error", response=_response(500, "Internal Server Error"),
        explanation=f'error while creating mount source path "{SECRET}/docker-boxes/ws": mkdir {SECRET}: '
                    "permission denied")


def image_not_found() -> docker.errors.ImageNotFound:
    return docker.errors.ImageNotFound(f"No such image: {IMAGE}", response=_response(404, "Not Found"),
                                       explanation=f"No such image: {IMAGE} (mounts under {SECRET})")


def container_error() -> docker.errors.ContainerError:
    return docker.errors.ContainerError("c0ffee", 1, ["python3"], IMAGE, f"cannot open {SECRET}/x".encode())


def connection_refused() -> docker.errors.DockerException:
    return docker.errors.DockerException(f"Error while fetching server API version: unix://{SOCKET} "
                                         f"({SECRET})")


class FakeApi:
    """The engine's low-level API: a container that starts, whose agent dies before it is ready."""

    def __init__(self, state_error: str = "") -> None:
        self.state_error = state_error
        self.removed: list[str] = []
        self.peer: socket.socket | None = None

    def attach_socket(self, container_id: str, params: dict) -> socket.socket:
        ours, self.peer = socket.socketpair()
        return ours

    def start(self, container_id: str) -> None:
        assert self.peer is not None  # the agent writes a traceback on stderr and exits
        text = f"Traceback: PermissionError: [Errno 13] Permission denied: '{SECRET}/agent'\n".encode()
        self.peer.sendall(struct.pack(">BxxxI", 2, len(text)) + text)
        self.peer.close()

    def inspect_container(self, container_id: str) -> dict:
        return {"State": {"Status": "exited", "ExitCode": 1, "Running": False, "Error": self.state_error}}

    def remove_container(self, container_id: str, force: bool = False, v: bool = False) -> None:
        self.removed.append(container_id)


class FakeEngine:
    """Just what a box start and a shutdown ask of the docker SDK client; ``create`` fails with ``fail``."""

    def __init__(self, fail: Exception | None = None, api: FakeApi | None = None) -> None:
        self.fail, self.api = fail, api or FakeApi()
        self.api.api_version = "1.41"  # a box is created through the low-level API (ContainerSpec.create_args)
        self.api.create_container = lambda **kw: {"Id": self.create(**kw).id}
        self.containers = self
        self.volumes = SimpleNamespace(list=lambda **_: [])
        self.creates = 0

    def create(self, **kwargs) -> SimpleNamespace:
        self.creates += 1
        if self.fail is not None:
            raise self.fail
        return SimpleNamespace(id="c0ffee" * 10)

    def list(self, **_) -> list:
        return []

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def no_host_side(tmp_path, monkeypatch):
    """No uid per box (that needs root): a box's /workspace is a tmpfs, nothing on the host."""
    monkeypatch.setenv("EXECBOX_JAIL_DIR", str(tmp_path))
    monkeypatch.setattr(docker_uid, "per_box_uids", lambda: False)


def provider(engine: FakeEngine, **config) -> DockerProvider:
    """An initialized provider on a fake engine (``initialize`` would ask a real one)."""
    p = DockerProvider()
    p.config = {**DockerProvider.schema_defaults(), "pool_size": 0, **config}
    p.docker, p.runtime, p.egress_cap, p.initialized = engine, "runc", EgressPolicy(), True
    return p


def assert_tenant_safe(err: InstanceCreationError, *hidden: str) -> None:
    shown = json.dumps(err.to_dict())
    assert err.code == "SB004" and err.http_status == 503
    for text in hidden:
        assert text not in shown and text not in str(err)
    assert "the server log has the details" in err.message


def logged(caplog, logger: str) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == logger)


@pytest.mark.parametrize("fail, shown", [
    (api_error, "the Docker engine refused to start the box (APIError, HTTP 500;"),
    (image_not_found, "the Docker engine refused to start the box (ImageNotFound, HTTP 404;"),
    (container_error, "the Docker client could not start the box (ContainerError;"),
    (connection_refused, "the Docker client could not start the box (DockerException;"),
])
def test_a_refused_container_start_tells_the_tenant_what_failed_and_the_log_why(fail, shown, caplog):
    p = provider(FakeEngine(fail()))
    with caplog.at_level(logging.WARNING), pytest.raises(InstanceCreationError) as ei:
        p.create_instance(tenant_id="t1", session_id="s1")
    err = ei.value
    assert_tenant_safe(err, SECRET, IMAGE, SOCKET)
    assert err.message.startswith("docker: could not start a container: ") and shown in err.message
    assert err.details == {"provider": "docker"}
    assert SECRET in logged(caplog, "execbox.provider")  # the whole error, for the operator
    assert SECRET in operator_message(err)  # doctor and the admin console's test still show it


def test_a_one_shot_start_is_cut_the_same_way(caplog):
    p = provider(FakeEngine(api_error()))
    with caplog.at_level(logging.WARNING), pytest.raises(InstanceCreationError) as ei:
        p.create_instance()
    assert_tenant_safe(ei.value, SECRET, SOCKET)
    assert SECRET in logged(caplog, "execbox.provider")


def test_an_agent_that_dies_before_ready_hides_the_engine_state_and_its_stderr(caplog):
    api = FakeApi(state_error=f"OCI runtime exec failed: open {SECRET}/config.json: no such file")
    p = provider(FakeEngine(api=api))
    with caplog.at_level(logging.WARNING), pytest.raises(InstanceCreationError) as ei:
        p.create_instance(tenant_id="t1", session_id="s1")
    err = ei.value
    assert_tenant_safe(err, SECRET, "OCI runtime", "Traceback")
    assert "agent failed to start" in err.message
    log_text = logged(caplog, "execbox.docker")
    assert "OCI runtime exec failed" in log_text and f"{SECRET}/agent" in log_text  # engine state, agent stderr
    assert "OCI runtime exec failed" in operator_message(err) and api.removed  # and the container went


def _failing_pool(p: DockerProvider) -> BoxPool:
    pool = BoxPool(p.start_pooled_box, 1, name="docker")
    deadline = time.monotonic() + 10
    while pool.status()["failures"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.status()["failures"] >= 1
    return pool


def test_a_pool_failing_to_start_containers_hands_the_tenant_no_engine_text(caplog):
    p = provider(FakeEngine(api_error()), pool_wait=0.05)
    p._pool = _failing_pool(p)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(InstanceCreationError) as ei:
            p.create_instance(tenant_id="t1")
        err = ei.value
        assert_tenant_safe(err, SECRET, SOCKET)
        assert "pool failing to start containers: the Docker engine refused to start the box (APIError, HTTP 500"\
            in err.message
        assert err.details["pool"]["healthy"] is False and "APIError" in err.details["pool"]["last_error"]
        assert SECRET in logged(caplog, "execbox.provider.docker")
        assert SECRET in operator_message(err)
        assert SECRET in p.pool_status()["last_error"]  # doctor, /readyz: the operator's view is whole
    finally:
        p._pool.close()
        p._pool.join(5)


def test_a_busy_pool_still_says_so():
    p = provider(FakeEngine(), pool_wait=0.01)
    p._pool = BoxPool(p.start_pooled_box, 0, name="docker")
    with pytest.raises(InstanceCreationError) as ei:
        p.create_instance()
    assert not isinstance(ei.value, BoxStartFailed)
    assert "all 0 pooled containers are in use" in ei.value.message


def test_the_admin_consoles_provider_test_still_shows_the_whole_reason(monkeypatch):
    from execbox.service import provider_probe

    engine = FakeEngine(api_error())
    monkeypatch.setattr(provider_probe.registry, "create_provider", lambda name, config: provider(engine))
    out = provider_probe.probe("docker", {})
    assert out["success"] is False and out["message"].startswith("SB004: docker: could not start a container")
    assert SECRET in out["message"] and out["details"]["error_code"] == "SB004"


def test_the_jails_cut_is_unchanged():
    """The jail's start failures read as they did before the Docker cut joined them."""
    assert agent_backed.tenant_safe(OSError(13, "Permission denied", f"{SECRET}/box")) == "Permission denied"
    assert agent_backed.tenant_safe(RuntimeError(f"mkfs.ext4 {SECRET}/img failed")) == \
        "RuntimeError (the server log has the details)"
    assert agent_backed.tenant_safe(QuotaUnavailable("workspace quota unavailable")) == "workspace quota unavailable"
    err = agent_backed.box_start_failed("jail", RuntimeError(f"mount {SECRET} failed"))
    assert err.message == "jail: could not start a box: RuntimeError (the server log has the details)"
    assert err.details == {"provider": "jail"} and err.code == "SB004" and isinstance(err, InstanceCreationError)


def test_execbox_doctor_still_shows_the_whole_reason(monkeypatch):
    from execbox.cli import doctor
    from execbox.providers import registry

    engine = FakeEngine(api_error())
    monkeypatch.setattr(registry, "create_provider", lambda name, config: provider(engine))
    out = doctor._probe("docker")
    assert out["ok"] is False and out["error"].startswith("SB004: docker: could not start a container")
    assert SECRET in out["error"]


def test_a_busy_pool_that_failed_once_hands_the_tenant_no_engine_text():
    """A pool that failed a start once and recovered keeps that failure as its last error; the
    busy pool's SB004 carried it whole in ``details.pool``."""
    p = provider(FakeEngine(), pool_wait=0.01)
    pool = BoxPool(p.start_pooled_box, 0, name="docker")
    pool.last_exception = api_error()  # an earlier, transient failure
    p._pool = pool
    with pytest.raises(InstanceCreationError) as ei:
        p.create_instance()
    assert "all 0 pooled containers are in use" in ei.value.message
    shown = json.dumps(ei.value.to_dict())
    assert "/var/lib/execbox" not in shown and "docker.sock" not in shown
    assert ei.value.details["pool"]["last_error"].startswith("the Docker engine refused to start the box")


def test_the_jails_cut_needs_no_docker_sdk(monkeypatch):
    """A jail-only host without the docker package (the lent 16-core machine): a box start failure
    turned into ModuleNotFoundError instead of its SB004."""
    import sys

    monkeypatch.setitem(sys.modules, "docker", None)  # `import docker.errors` raises ImportError
    monkeypatch.setitem(sys.modules, "docker.errors", None)
    err = agent_backed.box_start_failed("jail", OSError(28, "No space left on device", SECRET))
    assert err.code == "SB004" and err.message == "jail: could not start a box: No space left on device"
