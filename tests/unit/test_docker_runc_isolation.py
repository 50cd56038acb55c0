"""What a runc box is created with beyond Docker's defaults, without an engine: its own capped devpts
bound over /dev/pts (boxes/devpts.py via docker_host.py; the attack is
tests/integration/docker/test_pty_exhaustion.py) and the host's block-device views masked on top of
the daemon's own masked paths (boxes/docker_masks.py; tests/integration/docker/test_block_device_views.py).
gVisor boxes get neither: their sentry has its own devpts, /proc and /sys."""

from __future__ import annotations

import os

import pytest

from execbox.boxes import devpts, docker_box, docker_host, docker_masks, docker_uid

pytestmark = pytest.mark.usefixtures("own_uid_leases")


def spec(runtime: str = "runc", **kw) -> docker_box.ContainerSpec:
    return docker_box.ContainerSpec(name="b", image="i", runtime=runtime, labels={}, memory_bytes=256 << 20,
                                    cpus=1.0, pids_limit=64, **kw)


def _pts_mounts(s: docker_box.ContainerSpec) -> list[dict]:
    return [m for m in s.create_kwargs()["mounts"] if m["Target"] == "/dev/pts"]


def test_a_runc_box_binds_its_capped_devpts_over_dev_pts():
    (m,) = _pts_mounts(spec(pts_host="/var/lib/execbox/docker-boxes/docker-1-ab/pts"))
    assert (m["Type"], m["Source"], m["ReadOnly"]) == ("bind", "/var/lib/execbox/docker-boxes/docker-1-ab/pts", False)
    assert _pts_mounts(spec()) == []  # none mounted (not root): runc's own instance, as before


@pytest.mark.parametrize("runtime", ["runsc", "runsc-net"])
def test_a_gvisor_box_never_gets_the_host_s_devpts(runtime):
    assert _pts_mounts(spec(runtime, pts_host="/x/pts")) == []


def test_masked_paths_go_into_the_host_config_docker_py_builds():
    paths = docker_masks.masked_paths(["/proc/kcore"])
    args = docker_box.ContainerSpec.create_args(spec(masked_paths=paths, pts_host="/x/pts"), "1.41")
    hc = args["host_config"]
    assert hc["MaskedPaths"] == paths
    assert hc["ReadonlyRootfs"] is True and hc["Runtime"] == "runc" and hc["CapDrop"] == ["ALL"]  # the rest kept
    assert {"Target": "/dev/pts", "Source": "/x/pts", "Type": "bind", "ReadOnly": False} in hc["Mounts"]
    assert args["image"] == "i" and "--run-as" in args["command"] and args["labels"] == {}
    assert "MaskedPaths" not in spec("runsc").create_args("1.41")["host_config"]  # the daemon's list


def test_the_mask_list_keeps_the_engine_s_and_docker_s_defaults_and_adds_the_block_views():
    engine = ["/proc/asound", "/proc/kcore", "/sys/devices/system/cpu/cpu0/thermal_throttle"]
    paths = docker_masks.masked_paths(engine)
    assert paths[:3] == engine and len(paths) == len(set(paths))
    assert set(docker_masks.DOCKER_DEFAULTS) <= set(paths) and set(docker_masks.BLOCK_VIEWS) <= set(paths)
    assert {"/proc/diskstats", "/sys/block", "/sys/class/block", "/sys/devices/virtual/block"} <= set(paths)
    assert set(docker_masks.masked_paths()) == {*docker_masks.DOCKER_DEFAULTS, *docker_masks.BLOCK_VIEWS}


class ProbeApi:
    def __init__(self, fail: str = "") -> None:
        self.fail = fail
        self.calls: list[str] = []

    def create_host_config(self, **kw) -> dict:
        return {"NetworkMode": kw["network_mode"]}

    def create_container(self, image, command=None, **kw) -> dict:
        self.calls.append("create")
        if self.fail == "create":
            raise RuntimeError("no such image")
        assert kw["labels"] == {"execbox.owner": "me"} and kw["host_config"] == {"NetworkMode": "none"}
        return {"Id": "c0ffee" * 10}

    def inspect_container(self, cid) -> dict:
        self.calls.append("inspect")
        if self.fail == "inspect":
            raise RuntimeError("engine went away")
        return {"HostConfig": {"MaskedPaths": ["/proc/kcore", "/proc/new-in-a-later-docker"]}}

    def remove_container(self, cid, force=False) -> None:
        self.calls.append("remove")

    def start(self, cid) -> None:
        raise AssertionError("the probe is never started")


class Client:
    def __init__(self, api: ProbeApi) -> None:
        self.api = api


def test_the_engine_s_defaults_are_read_off_a_probe_that_never_runs():
    api = ProbeApi()
    assert docker_masks.engine_defaults(Client(api), "img", {"execbox.owner": "me"}) == [
        "/proc/kcore", "/proc/new-in-a-later-docker"]
    assert api.calls == ["create", "inspect", "remove"]


@pytest.mark.parametrize("fail, calls", [("create", ["create"]), ("inspect", ["create", "inspect", "remove"])])
def test_a_failed_probe_falls_back_to_docker_s_known_list(fail, calls, caplog):
    api = ProbeApi(fail)
    assert docker_masks.engine_defaults(Client(api), "img", {"execbox.owner": "me"}) == []
    assert api.calls == calls and "known list" in caplog.text


class Recorder:
    """devpts.mount/unmount as the host side calls them (the real ones: tests/unit/test_devpts.py)."""

    def __init__(self) -> None:
        self.mounted: list[str] = []
        self.unmounted: list[tuple[str, bool]] = []  # (box dir, its pts dir still there)

    def mount(self, box_dir: str, owner_uid: int | None = None) -> str:
        os.makedirs(devpts.path(box_dir), 0o755)
        self.mounted.append(box_dir)
        return devpts.path(box_dir)

    def unmount(self, box_dir: str) -> bool:
        self.unmounted.append((box_dir, os.path.isdir(devpts.path(box_dir))))
        for d in (devpts.path(box_dir), os.path.dirname(devpts.path(box_dir))):  # as the real one does
            if os.path.isdir(d):
                os.rmdir(d)
        return True


@pytest.fixture
def pts(monkeypatch):
    monkeypatch.setattr(docker_uid, "per_box_uids", lambda: True)  # the host side of a root service
    rec = Recorder()
    monkeypatch.setattr(docker_host.devpts, "mount", rec.mount)
    monkeypatch.setattr(docker_host.devpts, "unmount", rec.unmount)
    return rec


def test_a_runc_box_s_host_side_mounts_its_devpts_and_unmounts_it_before_removing_the_dir(pts):
    host = docker_host.HostSide.prepare(None, 8 << 20, ptys=True)
    try:
        assert host.host_dir is not None and host.pts == devpts.path(host.host_dir)
        assert pts.mounted == [host.host_dir]
        assert _pts_mounts(spec(pts_host=host.pts))[0]["Source"] == host.pts
    finally:
        host.release()
    assert pts.unmounted[0] == (host.host_dir, True) and not os.path.exists(host.host_dir)


def test_a_gvisor_box_s_host_side_mounts_no_devpts(pts):
    host = docker_host.HostSide.prepare(None, 8 << 20, ptys=False)
    try:
        assert host.pts is None and pts.mounted == [] and not os.path.exists(devpts.path(host.host_dir))
    finally:
        host.release()


def test_the_sweep_of_a_dead_service_s_box_unmounts_its_devpts(pts):
    root = docker_host.boxes_root()
    dead = os.path.join(root, f"{docker_host.PREFIX}999999999-abc")  # no such pid
    os.makedirs(devpts.path(dead))

    class Nothing:
        containers = None

        def __init__(self) -> None:
            self.containers = self

        def list(self, **_) -> list:
            return []

    assert docker_host.sweep(Nothing()) == 1
    assert (dead, True) in pts.unmounted and not os.path.exists(dead)
