"""The jail's cheaper start path (issue 21): syscall loop mounts, staged agent bytecode.

Each test checks behaviour a box relies on, so a faster path that lost a mount flag, leaked a
loop device or stopped falling back to the tools fails here. Speed itself is measured in bench/.
"""

from __future__ import annotations

import errno
import os
import struct
import time

import pytest

from execbox.boxes import loopdev, quota, runtime, staging
from tests.conftest import require
from tests.integration.jail.conftest import cgroups_ready, make_provider


def _loop_ready() -> None:
    require(quota.loop_quota_possible()[0], f"loop-mounted workspace quota ({quota.loop_quota_possible()[1]})")


def _mount_options(path: str) -> set[str] | None:
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if fields[4] == target:
                return set(fields[5].split(","))
    return None


def _wait_no_loop(image: str, timeout: float = 5.0) -> list[str]:
    end = time.monotonic() + timeout
    while (devs := loopdev.backing_devices(image)) and time.monotonic() < end:
        time.sleep(0.02)
    return devs


@pytest.fixture
def image(tmp_path):
    _loop_ready()
    img = str(tmp_path / "ws.img")
    quota.sparse_copy(quota._template(16 * 1024 * 1024), img)
    mnt = str(tmp_path / "mnt")
    os.mkdir(mnt)
    yield img, mnt
    quota.unmount(mnt)


def test_syscall_mount_has_the_flags_and_quota_and_frees_its_loop_device(image):
    img, mnt = image
    dev = loopdev.mount_image(img, mnt)
    opts = _mount_options(mnt)
    assert opts is not None and {"nosuid", "nodev", "noatime"} <= opts
    assert loopdev.backing_devices(img) == [dev], "sysfs must name the loop device backing the image"
    assert loopdev.backing_devices(img, [dev]) == [dev]  # the one-device check teardown uses
    others = [f"/dev/{n}" for n in sorted(os.listdir("/sys/block")) if n.startswith("loop") and f"/dev/{n}" != dev]
    assert loopdev.backing_devices(img, [*others[:1], "/dev/loop999999"]) == []  # a host may have no other
    with pytest.raises(OSError) as e:  # the image size is the quota
        with open(os.path.join(mnt, "big"), "wb") as f:
            f.write(b"\0" * (32 * 1024 * 1024))
    assert e.value.errno == errno.ENOSPC
    assert loopdev.unmount(mnt)
    assert _mount_options(mnt) is None
    assert _wait_no_loop(img) == [], "autoclear must release the loop device after the unmount"


def test_a_burst_of_mounts_each_gets_a_loop_device(tmp_path):
    """100 threads mounting and unmounting together, like a burst of box starts and teardowns.

    Every concurrent caller is handed the same free loop number; they used to race for it and
    give up after 32 EBUSY tries (a 100-request burst got SB004 "no free loop device")."""
    from concurrent.futures import ThreadPoolExecutor

    _loop_ready()
    import threading

    template = quota._template(16 * 1024 * 1024)
    together = threading.Barrier(100)  # every thread asks for a free device at the same moment

    def cycle(i: int) -> list[str]:
        img, mnt = str(tmp_path / f"ws{i}.img"), str(tmp_path / f"mnt{i}")
        quota.sparse_copy(template, img)
        os.mkdir(mnt)
        errors = []
        for _ in range(4):
            together.wait(timeout=60)
            try:
                loopdev.mount_image(img, mnt)
            except OSError as e:
                errors.append(str(e))
                continue
            if len(loopdev.backing_devices(img)) != 1:
                errors.append(f"{img}: not exactly one loop device")
            loopdev.unmount(mnt)
        return errors

    with ThreadPoolExecutor(100) as ex:
        errors = [e for errs in ex.map(cycle, range(100)) for e in errs]
    assert errors == []
    assert all(_wait_no_loop(str(tmp_path / f"ws{i}.img")) == [] for i in range(100))


def test_falls_back_to_mount8_when_loop_configure_is_refused(image, monkeypatch):
    img, mnt = image
    monkeypatch.setattr(loopdev, "LOOP_CONFIGURE", 0x4CFF)  # an ioctl the loop driver rejects
    monkeypatch.setattr(quota, "_syscalls", True)
    quota.mount_image(img, mnt)
    assert quota._syscalls is False  # remembered: later boxes go straight to the tools
    opts = _mount_options(mnt)
    assert opts is not None and {"nosuid", "nodev", "noatime"} <= opts
    quota.unmount(mnt)
    assert _mount_options(mnt) is None
    assert _wait_no_loop(img) == []


def test_box_teardown_leaves_no_loop_device_or_mount():
    _loop_ready()
    from execbox.boxes.jail_box import drain

    p = make_provider(oneshot_workspace="disk")  # a one-shot on an image, as sessions have
    try:
        inst = p.create_instance()
        box = p._instances[inst.instance_id].box
        img, mnt = box.ws.image, box.ws.mount_dir
        assert p.execute_code(inst.instance_id, "open('/workspace/f','w').write('x');print(1)", "python", 30).stdout \
            == "1\n"
        assert loopdev.backing_devices(img) == [box.ws.loop_dev]  # teardown checks only this one
        p.destroy_instance(inst.instance_id)
        assert drain(30)
        assert _mount_options(mnt) is None
        assert not os.path.exists(img)
        assert _wait_no_loop(img) == []
    finally:
        p.shutdown()


def test_staged_agent_carries_unchecked_bytecode_that_boxes_load():
    root = staging.staged_agent()
    pkg = os.path.join(root, runtime.AGENT_PACKAGE)
    pycs = os.listdir(os.path.join(pkg, "__pycache__"))
    assert any(n.startswith("main.") and n.endswith(".pyc") for n in pycs)
    for n in pycs:
        with open(os.path.join(pkg, "__pycache__", n), "rb") as f:
            flags = struct.unpack("<I", f.read(8)[4:8])[0]
        assert flags == 1, f"{n}: hash-based, unchecked (flags {flags})"  # PEP 552: bit 0 hash, bit 1 check
        assert os.stat(os.path.join(pkg, "__pycache__", n)).st_mode & 0o044 == 0o044  # box uid reads it
    p = make_provider()
    try:
        inst = p.create_instance()
        code = ("import sys, os\nm = sys.modules['execbox_agent.main']\n"
                "print(os.path.exists(m.__cached__), 'argparse' in sys.modules, 'dataclasses' in sys.modules)")
        r = p.execute_code(inst.instance_id, code, "python", 30)
        # the agent found its bytecode and started without the modules it no longer needs
        assert r.stdout == "True False False\n", r.stderr
        p.destroy_instance(inst.instance_id)
    finally:
        p.shutdown()


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


@pytest.mark.parametrize("launcher", ["sh+setpriv", "preexec fallback"])
def test_box_processes_join_the_cgroup_and_the_leased_uid_before_bwrap_runs(launcher, monkeypatch):
    """Without a preexec_fn (so subprocess can vfork), sh + setpriv must do what the fork did:
    every process of the box, bwrap itself included, in the box's cgroups and as its host uid
    with no supplementary groups. Where the tools are missing, the preexec path still does it."""
    cgroups_ready()
    from execbox.boxes import jail_box

    require(os.geteuid() == 0, "root (cgroups and a host uid per box)")
    if launcher == "preexec fallback":
        monkeypatch.setattr(jail_box, "_tool", lambda name: None)
    p = make_provider()
    try:
        inst = p.create_instance()
        b = p._instances[inst.instance_id].box
        assert b.cgroup is not None and b.lease is not None
        r = p.execute_code(inst.instance_id, "import os; print(os.getuid())", "python", 20)
        assert (r.exit_code, r.stdout) == (0, "1000\n")  # the box's own view of its user
        pids = b.cgroup.pids()
        assert b.proc.pid in pids and len(pids) >= 2  # bwrap and the agent it started
        checked = 0
        for pid in pids:
            try:
                st = _status(pid)
            except FileNotFoundError:
                continue  # the run's child exiting, or a spare in the making
            checked += 1
            assert st["Uid"].split() == [str(b.lease.uid)] * 4, (pid, st["Uid"])
            assert st["Gid"].split() == [str(b.lease.uid)] * 4, (pid, st["Gid"])
            assert st["Groups"].strip() == "", (pid, st["Groups"])
            assert int(st["CapEff"], 16) == 0 and int(st["CapPrm"], 16) == 0, pid
        assert checked >= 2
        with open(f"/proc/{b.proc.pid}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[0].endswith(b"bwrap")  # sh and setpriv exec'd themselves away
    finally:
        p.shutdown()


def test_a_cgroup_that_cannot_be_joined_fails_the_start_with_the_reason(monkeypatch, caplog):
    """The launcher must never start a box outside its limits: a failed write stops it. The
    reason (it names host paths) is in the server log; the caller's error says the start failed."""
    cgroups_ready()
    from execbox.boxes import cgroups, jail_box

    require(os.geteuid() == 0, "root (cgroups and a host uid per box)")
    real = cgroups.BoxCgroup.procs_files
    monkeypatch.setattr(cgroups.BoxCgroup, "procs_files",
                        lambda self: [*real(self), "/proc/execbox-no-such-dir/cgroup.procs"])
    p = make_provider()
    try:
        with caplog.at_level("WARNING", logger="execbox.provider"), pytest.raises(Exception) as err:
            p.create_instance()
        assert "could not start a box" in str(err.value) and "execbox-no-such-dir" not in str(err.value)
        assert "execbox-no-such-dir" in caplog.text
        assert jail_box.drain()
    finally:
        p.shutdown()


WORKSPACE_MOUNT = """
import json, os
fs = [l.split(" - ")[1].split()[0] for l in open("/proc/self/mountinfo") if l.split()[4] == "/workspace"]
st = os.statvfs("/workspace")
print(json.dumps({"fs": fs[-1], "mb": st.f_blocks * st.f_frsize >> 20}))
"""


def _workspace_fs(p, inst) -> dict:
    import json

    r = p.execute_code(inst.instance_id, WORKSPACE_MOUNT, "python", 30)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_a_one_shot_box_gets_a_tmpfs_workspace_of_the_quota_and_a_session_an_image(tmp_path):
    """One-shots (no session, no pooled box ready) skip the workspace image: nothing of theirs
    outlives the run, and attaching, mounting and removing it was ~7 ms of CPU per box."""
    _loop_ready()
    from execbox.boxes.jail_box import drain

    p = make_provider()  # quota 32 MB, pool 0
    disk = make_provider(oneshot_workspace="disk")
    try:
        assert p.applied_limits()["oneshot_workspace"] == "tmpfs"
        shot = p.create_instance()
        box = p._instances[shot.instance_id].box
        assert _workspace_fs(p, shot) == {"fs": "tmpfs", "mb": 32}
        assert box.ws.image is None and box.ws.loop_dev is None and box.workspace is None
        assert "workspace.img" not in os.listdir(box.box_dir)
        # the quota holds as on an image (two files: RLIMIT_FSIZE stops one file at the quota)
        r = p.execute_code(shot.instance_id, "import os\ntry:\n    for n in ('b1', 'b2'):\n"
                                             "        open(n, 'wb').write(os.urandom(20 << 20))\n"
                                             "except OSError as e:\n    print(e.strerror)", "python", 30)
        assert r.stdout.strip() == "No space left on device", r
        p.destroy_instance(shot.instance_id)

        session = p.create_instance(session_id="s")  # a session's files may be kept: an image
        assert _workspace_fs(p, session)["fs"] == "ext4"
        p.destroy_instance(session.instance_id)
        kept = p.create_instance(session_id="k", workspace=str(tmp_path / "k"))
        assert _workspace_fs(p, kept)["fs"] == "ext4"
        p.destroy_instance(kept.instance_id)

        other = disk.create_instance()
        assert _workspace_fs(disk, other) == {"fs": "ext4", "mb": _workspace_fs(disk, other)["mb"]}
        assert disk._instances[other.instance_id].box.ws.image is not None
        disk.destroy_instance(other.instance_id)
        assert drain(30)
    finally:
        p.shutdown()
        disk.shutdown()


def test_pooled_boxes_keep_an_image_so_a_session_can_adopt_them():
    _loop_ready()
    p = make_provider(pool_size=1)
    try:
        deadline = time.monotonic() + 60
        while (p.pool_status() or {}).get("ready", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        inst = p.create_instance()
        assert inst.metadata["from_pool"] is True
        assert _workspace_fs(p, inst)["fs"] == "ext4"
        p.destroy_instance(inst.instance_id)
    finally:
        p.shutdown()


def test_a_bad_oneshot_workspace_value_is_sb002_naming_it():
    from execbox.errors import InvalidConfigError
    from execbox.providers.jail import JailProvider

    with pytest.raises(InvalidConfigError) as e:
        JailProvider().initialize({"oneshot_workspace": "ramdisk"})
    assert e.value.code == "SB002" and "oneshot_workspace" in str(e.value.details) + e.value.message


USER_MODULES = "import sys\nprint(sorted(m for m in ('re', 'json', 'linecache') if m in sys.modules))"


def test_a_one_shot_box_starts_its_agent_lean_and_a_session_box_shares_common_imports():
    """A one-shot's box serves one run: its agent skips importing re/json/linecache for later runs
    (agent --oneshot; ~6-8 ms of CPU, a sixth of a one-shot). A session's and a pooled box's agents
    import them at start so each run's fork inherits them. Both still run code that needs them."""
    p = make_provider()  # pool 0: a one-shot's box is started for it
    pooled = make_provider(pool_size=1)
    try:
        shot = p.create_instance()
        assert "--oneshot" in p._instances[shot.instance_id].box.proc.args
        assert p.execute_code(shot.instance_id, USER_MODULES, "python", 30).stdout == "[]\n"
        r = p.execute_code(shot.instance_id, "import json, re\nprint(json.dumps(re.findall('a.', 'abac')))",
                           "python", 30)
        assert r.stdout == '["ab", "ac"]\n'
        p.destroy_instance(shot.instance_id)

        session = p.create_instance(session_id="lean-s")
        assert "--oneshot" not in p._instances[session.instance_id].box.proc.args
        r = p.execute_code(session.instance_id, USER_MODULES, "python", 30)
        assert r.stdout == "['json', 'linecache', 're']\n"
        p.destroy_instance(session.instance_id)

        deadline = time.monotonic() + 60
        while (pooled.pool_status() or {}).get("ready", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        inst = pooled.create_instance()
        assert inst.metadata["from_pool"] is True
        r = pooled.execute_code(inst.instance_id, USER_MODULES, "python", 30)
        assert r.stdout == "['json', 'linecache', 're']\n"
        pooled.destroy_instance(inst.instance_id)
    finally:
        p.shutdown()
        pooled.shutdown()
