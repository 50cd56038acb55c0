"""The host side of a Docker box (boxes/docker_host.py, docker_uid.py) without an engine: uid pins
outlive the process that leased them and are swept once their box is gone, a re-attach takes the
recorded uid over or refuses, a failed start releases everything, and without root every box keeps
uid 1000 but still gets a size-limited /workspace. The container is created with no log driver."""

from __future__ import annotations

import subprocess
import sys

import pytest

from execbox.boxes import docker_box, docker_host, docker_uid, uids
from execbox.boxes.images import SANDBOX_UID
from execbox.errors import InstanceCreationError, RateLimitError

pytestmark = pytest.mark.usefixtures("own_uid_leases")


@pytest.fixture
def root(monkeypatch):
    monkeypatch.setattr(docker_uid, "per_box_uids", lambda: True)


class Container:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels


class Client:
    """Just what the sweeps ask the engine: containers by label."""

    def __init__(self, *labelled: dict[str, str]) -> None:
        self.containers = self
        self._all = [Container(lb) for lb in labelled]

    def list(self, all: bool = False, filters: dict | None = None, ignore_removed: bool = False) -> list:  # noqa: A002
        key = (filters or {}).get("label", "")
        return [c for c in self._all if key in c.labels]


def _pin_left_by_a_dead_process(uid: int, note: str = "docker:box") -> None:
    """A process that leased and pinned ``uid``, then died (its flock went with it)."""
    code = ("import sys\nfrom execbox.boxes import uids\n"
            f"uids.HOST_LOCK_DIR = {uids.HOST_LOCK_DIR!r}\n"
            f"lease = uids.try_acquire({uid})\nuids.pin(lease, {note!r})\n")
    subprocess.run([sys.executable, "-c", code], check=True)  # noqa: S603


def test_a_pinned_uid_stays_out_of_circulation_after_its_process_died():
    _pin_left_by_a_dead_process(300000)
    with pytest.raises(RateLimitError):  # no process holds it, yet its box may still run
        uids.acquire(uids.UidRange(300000, 1))
    assert uids.acquire(uids.UidRange(300000, 2)).uid == 300001


def test_sweep_unpins_only_uids_whose_box_is_gone_and_nobody_holds(root):
    _pin_left_by_a_dead_process(300000)  # its container is gone
    _pin_left_by_a_dead_process(300001)  # its container still runs (a session kept across a restart)
    _pin_left_by_a_dead_process(300002, note="something else")  # not a Docker box's pin
    live = uids.try_acquire(300003)
    uids.pin(live, "docker:mine")  # a box this process is starting right now
    client = Client({docker_uid.RUN_AS_LABEL: "300001"})
    assert docker_uid.sweep_pins(client) == [300000]
    assert uids.pinned() == [300001, 300002, 300003]
    assert uids.acquire(uids.UidRange(300000, 1)).uid == 300000


def test_sweep_leaves_pins_and_host_dirs_of_another_engine_alone(root, tmp_path, monkeypatch):
    """Host dirs and pins are host-wide; a sweep only knows its own engine's containers (review 40)."""
    mine, theirs = "a" * 16, "b" * 16
    _pin_left_by_a_dead_process(300020, docker_uid.pin_text("docker-1-aa", mine))
    _pin_left_by_a_dead_process(300021, docker_uid.pin_text("docker-1-bb", theirs))
    _pin_left_by_a_dead_process(300022, docker_uid.pin_text("docker-1-cc"))  # from before engines were noted
    boxes = tmp_path / "boxes"
    boxes.mkdir()
    monkeypatch.setattr(docker_host, "boxes_root", lambda: str(boxes))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    for name, engine in (("aa", mine), ("bb", theirs), ("cc", None)):
        d = boxes / f"docker-{dead}-{name}"
        d.mkdir()
        if engine:
            (d / docker_host.ENGINE_FILE).write_text(engine)
    assert docker_host.sweep(Client(), engine=mine) == 2
    assert sorted(p.name for p in boxes.iterdir()) == [f"docker-{dead}-bb"]
    assert uids.pinned() == [300021]
    assert docker_uid.parse_note(uids.pin_note(300021) or "") == ("docker-1-bb", theirs)


def test_the_engine_key_tells_engines_on_one_host_apart():
    """dockerd 20.10 derives its ID from the host's key.json: two engines on a host had the same."""
    a = docker_uid.engine_key({"ID": "44OP:AFKV", "DockerRootDir": "/var/lib/docker"})
    b = docker_uid.engine_key({"ID": "44OP:AFKV", "DockerRootDir": "/tmp/xbd1/root"})
    assert a and b and a != b and " " not in a
    assert docker_uid.engine_key({}) == ""


def test_take_over_leases_the_recorded_uid_or_refuses(root):
    _pin_left_by_a_dead_process(300010)
    lease = docker_uid.take_over({docker_uid.RUN_AS_LABEL: "300010"})
    assert lease is not None and lease.uid == 300010 and lease.held
    with pytest.raises(InstanceCreationError) as ei:  # a live process holds it: not ours to run as
        docker_uid.take_over({docker_uid.RUN_AS_LABEL: "300010"})
    assert ei.value.code == "SB004"
    with pytest.raises(InstanceCreationError):  # started before per-box uids: its code runs as 1000
        docker_uid.take_over({})
    docker_uid.release(lease)
    assert uids.pinned() == []


def test_removing_a_container_unpins_its_uid_but_not_a_newer_box_s_pin(root):
    """Pins go with a reboot (/run is tmpfs), a stopped container and its labels do not: its uid
    may meanwhile be another box's, whose pin removing the old container must leave alone."""
    assert docker_uid.HOST_DIR_LABEL == docker_host.HOST_DIR_LABEL
    _pin_left_by_a_dead_process(300020, note="docker:docker-2-new")  # the new box (its process restarting)
    old = {docker_uid.RUN_AS_LABEL: "300020", docker_uid.HOST_DIR_LABEL: "/var/lib/x/docker-1-old"}
    docker_host.release_removed(old)  # the pre-reboot container, removed when its session is not re-attached
    assert uids.pinned() == [300020]
    with pytest.raises(RateLimitError):
        uids.acquire(uids.UidRange(300020, 1))
    docker_uid.release_label({docker_uid.RUN_AS_LABEL: "300020", docker_uid.HOST_DIR_LABEL: "/x/docker-2-new"})
    assert uids.pinned() == []  # its own container gone: the uid is free
    _pin_left_by_a_dead_process(300021, note="docker:docker-3")
    docker_uid.release_label({docker_uid.RUN_AS_LABEL: "300021", docker_uid.HOST_DIR_LABEL: "/x/docker-3"})
    assert uids.pinned() == []


def test_a_failed_start_releases_uid_and_workspace(root):
    host = docker_host.HostSide.prepare(None, 8 << 20)
    assert host.lease is not None and uids.pinned() == [host.uid]

    class Api:
        api_version = "1.41"

        def create_container(self, **kwargs):
            assert kwargs["command"][kwargs["command"].index("--run-as") + 1] == f"{host.uid}:{host.uid}"
            raise RuntimeError("engine refused the create")

    class FailingClient:
        api = Api()

    spec = docker_box.ContainerSpec(name="b", image="i", runtime="runc", labels={}, memory_bytes=256 << 20,
                                    cpus=1.0, pids_limit=64, host_workspace=host.bind,
                                    workspace_tmpfs=host.tmpfs_bytes, run_as=host.uid, nss=host.nss)
    with pytest.raises(RuntimeError, match="refused"):
        docker_box.start_container(FailingClient(), spec, host)
    assert uids.pinned() == [] and not host.lease
    assert host.host_dir is not None and not docker_host.os.path.exists(host.host_dir)


def test_the_box_has_a_passwd_entry_for_its_uid(tmp_path):
    files = docker_uid.write_nss(str(tmp_path), 61234)
    passwd = open(files["/etc/passwd"]).read()
    assert "sandbox:x:61234:61234:execbox sandbox:/workspace:/bin/bash" in passwd
    assert "sandbox:x:61234:" in open(files["/etc/group"]).read()


def test_without_root_every_box_is_uid_1000_with_a_bounded_tmpfs_workspace(monkeypatch, tmp_path):
    monkeypatch.setattr(docker_uid, "per_box_uids", lambda: False)
    host = docker_host.HostSide.prepare(None, 16 << 20)
    assert (host.uid, host.lease, host.bind, host.tmpfs_bytes) == (SANDBOX_UID, None, None, 16 << 20)
    spec = docker_box.ContainerSpec(name="b", image="i", runtime="runc", labels={}, memory_bytes=256 << 20,
                                    cpus=1.0, pids_limit=64, workspace_tmpfs=host.tmpfs_bytes, run_as=host.uid)
    kw = spec.create_kwargs()
    assert kw["tmpfs"]["/workspace"] == f"rw,nosuid,nodev,size={16 << 20},mode=0700,uid=1000,gid=1000"
    assert not [m for m in kw["mounts"] if m["Target"] == "/workspace"]
    assert "1000:1000" in kw["command"]
    host.release()


def test_containers_get_no_log_driver():
    """json-file kept an unbounded host copy of the agent's stdout: every file read and output."""
    spec = docker_box.ContainerSpec(name="b", image="i", runtime="runc", labels={}, memory_bytes=256 << 20,
                                    cpus=1.0, pids_limit=64)
    assert spec.create_kwargs()["log_config"] == {"type": "none", "config": {}}


def _some_account() -> int:
    import pwd

    return next(e.pw_uid for e in pwd.getpwall() if e.pw_uid != 0)


def test_doctor_flags_a_box_uid_range_holding_a_real_account(root, monkeypatch):
    from execbox.providers.docker import DockerProvider

    taken = _some_account()
    monkeypatch.setenv("EXECBOX_JAIL_UID_RANGE", f"{taken}:1")
    check = DockerProvider.diagnose()["box_uids"]
    assert check["ok"] is False and "real users" in check["detail"]
    monkeypatch.setenv("EXECBOX_JAIL_UID_RANGE", "3000000000:16")
    assert DockerProvider.diagnose()["box_uids"]["ok"] is True


def test_doctor_flags_uid_1000_being_a_host_account_without_root(monkeypatch):
    monkeypatch.setattr(docker_uid, "per_box_uids", lambda: False)
    monkeypatch.setattr(docker_uid, "SANDBOX_UID", _some_account())
    check = docker_uid.uid_check()
    assert check["ok"] is False and "not root" in check["detail"]
    monkeypatch.setattr(docker_uid, "SANDBOX_UID", 3000000000)
    assert docker_uid.uid_check()["ok"] is True
