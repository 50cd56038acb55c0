"""Host uid leases for jail boxes (boxes/uids.py): distinct while held, shared across processes
through flock, given back on release or death, SB008 when the range is used up. The lease
directory is host-wide (not under EXECBOX_JAIL_DIR) and refused when it could be someone else's,
and pins and locks an execbox from before that move left in <jail dir>/uids still count."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys

import pytest

from execbox.boxes import docker_uid, uids
from execbox.errors import InvalidConfigError, RateLimitError

pytestmark = pytest.mark.usefixtures("own_uid_leases")


def test_range_parsing(monkeypatch):
    assert uids.configured_range() == uids.UidRange(61000, 4096)
    monkeypatch.setenv("EXECBOX_JAIL_UID_RANGE", "200000:65536")
    r = uids.configured_range()
    assert (r.first, r.last) == (200000, 265535) and 265535 in r and 265536 not in r
    for bad in ("0:10", "100", "100:0", "a:b", "4294967290:100", "-1:5"):
        monkeypatch.setenv("EXECBOX_JAIL_UID_RANGE", bad)
        with pytest.raises(InvalidConfigError) as e:
            uids.configured_range()
        assert e.value.code == "SB002" and "EXECBOX_JAIL_UID_RANGE" in e.value.message
    monkeypatch.delenv("EXECBOX_JAIL_UID_RANGE")
    monkeypatch.setenv("EXECBOX_JAIL_HOST_UID", "70000")  # legacy: the first uid of the range
    assert uids.configured_range() == uids.UidRange(70000, 4096)


def test_leases_are_distinct_until_released_and_exhaustion_is_sb008():
    rng = uids.UidRange(300000, 3)
    leases = [uids.acquire(rng) for _ in range(3)]
    assert sorted(lease.uid for lease in leases) == [300000, 300001, 300002]
    with pytest.raises(RateLimitError) as e:
        uids.acquire(rng)
    assert e.value.code == "SB008" and "300000-300002" in e.value.message
    freed = leases[1].uid
    leases[1].release()
    leases[1].release()  # idempotent
    again = uids.acquire(rng)
    assert again.uid == freed
    for lease in [*leases, again]:
        lease.release()


HOLDER = """
import sys, time
from execbox.boxes import uids
uids.HOST_LOCK_DIR = sys.argv[2]
lease = uids.acquire(uids.UidRange(int(sys.argv[1]), 2))
print(lease.uid, flush=True)
sys.stdin.read()   # hold until the test closes our stdin, or kills us
"""


def test_a_lease_held_by_another_process_is_skipped_and_freed_when_it_dies():
    first = 310000
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(first), uids.HOST_LOCK_DIR], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        held = int(holder.stdout.readline())
        mine = uids.acquire(uids.UidRange(first, 2))
        assert mine.uid != held  # the other process's box keeps its uid
        with pytest.raises(RateLimitError):
            uids.acquire(uids.UidRange(first, 2))
        holder.kill()  # a crash: the kernel drops its flock
        holder.wait(timeout=10)
        assert uids.acquire(uids.UidRange(first, 2)).uid == held
    finally:
        holder.kill()
        holder.wait()


def test_users_in_range_finds_real_accounts():
    assert uids.users_in_range(uids.UidRange(0, 1)) == ["root(0)"]
    assert uids.users_in_range(uids.UidRange(3_000_000_000, 10)) == []


# Root only leases host uids; these tests act as root (host-wide leases) whoever runs them.
SESSION = """
import json, os, sys
from execbox.boxes import uids
from execbox.errors import RateLimitError
uids.HOST_LOCK_DIR = sys.argv[1]
uids._host_wide = lambda: True   # what running as root means
rng = uids.UidRange(int(sys.argv[2]), 2)
held = []
for _ in range(int(sys.argv[3])):
    try:
        held.append(uids.acquire(rng).uid)
    except RateLimitError:
        held.append("SB008")
print(json.dumps(held), flush=True)
sys.stdin.read()   # hold until the test closes our stdin
"""


def _session(tmp_path, jail_dir: str, first: int, count: int) -> subprocess.Popen:
    env = {**os.environ, "EXECBOX_JAIL_DIR": str(tmp_path / jail_dir)}
    return subprocess.Popen([sys.executable, "-c", SESSION, uids.HOST_LOCK_DIR, str(first), str(count)],  # noqa: S603
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def test_processes_with_different_jail_dirs_never_share_a_uid(tmp_path):
    """The finding: leases under <EXECBOX_JAIL_DIR>/uids let a service and another execbox process
    with its own jail dir (a second service, a CLI one-shot) hand one host uid to two tenants'
    boxes at once; that uid's kernel limits (inotify instances...) were then shared."""
    a = _session(tmp_path, "jail-a", 320000, 1)
    b = None
    try:
        got_a = json.loads(a.stdout.readline())
        b = _session(tmp_path, "jail-b", 320000, 2)
        got_b = json.loads(b.stdout.readline())
        assert got_a[0] in (320000, 320001)
        assert got_b == [({320000, 320001} - {got_a[0]}).pop(), "SB008"], (got_a, got_b)
    finally:
        for p in (a, b):
            if p is not None:
                p.kill()
                p.wait()


@pytest.fixture
def as_root(monkeypatch):
    monkeypatch.setattr(uids, "_host_wide", lambda: True)


def _refused(what: str) -> None:
    with pytest.raises(InvalidConfigError) as e:
        uids.acquire(uids.UidRange(330000, 2))
    assert e.value.code == "SB002" and what in e.value.message
    for call in (uids.pinned, lambda: uids.try_acquire(330000), uids.lock_dir):
        with pytest.raises(InvalidConfigError):
            call()


def test_the_lease_dir_is_created_private(as_root, tmp_path):
    lease = uids.acquire(uids.UidRange(330000, 1))
    lease.release()
    st = os.lstat(uids.HOST_LOCK_DIR)
    assert st.st_mode & 0o777 == 0o700 and st.st_uid == os.geteuid()
    assert os.lstat(os.path.dirname(uids.HOST_LOCK_DIR)).st_mode & 0o022 == 0
    assert not os.path.exists(tmp_path / "uids")  # nothing under the jail dir any more


def test_a_symlinked_lease_dir_is_refused_and_not_followed(as_root, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "run").mkdir(mode=0o755)
    os.symlink(elsewhere, uids.HOST_LOCK_DIR)
    _refused(f"{uids.HOST_LOCK_DIR} is a symlink")
    assert os.listdir(elsewhere) == []
    os.unlink(uids.HOST_LOCK_DIR)
    os.symlink(tmp_path / "missing", uids.HOST_LOCK_DIR)  # dangling: not created through it either
    _refused("is a symlink")
    assert not os.path.lexists(tmp_path / "missing")


def test_a_symlinked_parent_is_refused(as_root, tmp_path):
    (tmp_path / "other").mkdir(mode=0o755)
    os.symlink(tmp_path / "other", tmp_path / "run")
    _refused(f"{tmp_path / 'run'} is a symlink")
    assert os.listdir(tmp_path / "other") == []


def test_a_lease_dir_that_is_a_file_or_open_to_others_is_refused(as_root, tmp_path):
    (tmp_path / "run").mkdir(mode=0o755)
    with open(uids.HOST_LOCK_DIR, "w"):
        pass
    _refused("is not a directory")
    os.unlink(uids.HOST_LOCK_DIR)
    os.mkdir(uids.HOST_LOCK_DIR)
    os.chmod(uids.HOST_LOCK_DIR, 0o1777)
    _refused("writable by others")
    os.chmod(uids.HOST_LOCK_DIR, 0o700)
    os.chmod(tmp_path / "run", 0o775)
    _refused(f"{tmp_path / 'run'} is writable by others")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory to another user")
def test_a_lease_dir_owned_by_another_user_is_refused(as_root, tmp_path):
    (tmp_path / "run").mkdir(mode=0o755)
    os.mkdir(uids.HOST_LOCK_DIR, 0o700)
    os.chown(uids.HOST_LOCK_DIR, 65534, 65534)
    _refused("owned by uid 65534")
    os.chown(uids.HOST_LOCK_DIR, 0, 0)
    os.chown(tmp_path / "run", 65534, 65534)
    _refused(f"{tmp_path / 'run'} is owned by uid 65534")


def test_pins_and_locks_left_in_the_old_location_still_count(as_root, tmp_path):
    """A service upgraded in place: its Docker box outlived the old process, whose pin sits in
    <jail dir>/uids; an old process still running holds its lock there."""
    old = tmp_path / "uids"
    old.mkdir(mode=0o700)
    (old / "340000.lock").touch()
    (old / "340000.pin").write_text("docker:docker-1-old")
    (old / "340002.lock").touch()
    live_old = os.open(old / "340002.lock", os.O_RDWR)
    fcntl.flock(live_old, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (another open file: as another process)
    try:
        assert uids.pinned() == [340000]
        with pytest.raises(RateLimitError):
            uids.acquire(uids.UidRange(340000, 1))
        with pytest.raises(RateLimitError):
            uids.acquire(uids.UidRange(340002, 1))
        assert uids.try_acquire(340002) is None
        mine = uids.acquire(uids.UidRange(340000, 3))
        assert mine.uid == 340001
        # the lease holds the old lock too where one exists, so an old process skips it as well
        leased = uids.acquire(uids.UidRange(340003, 1))
        (old / "340004.lock").touch()
        also_old = uids.acquire(uids.UidRange(340004, 1))
        probe = os.open(old / "340004.lock", os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        also_old.release()
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(probe)
        # and where the old process never made one: it would make and flock it, and must find it held
        probe = os.open(old / "340003.lock", os.O_RDWR | os.O_CREAT)
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(probe)
        # the restarted service takes the box over, then gives the uid back once it is gone
        assert docker_uid._pinned_by_docker(340000)
        taken = uids.try_acquire(340000)
        assert taken is not None
        uids.unpin(taken)
        taken.release()
        assert uids.pinned() == [] and not (old / "340000.pin").exists()
        assert uids.acquire(uids.UidRange(340000, 1)).uid == 340000
        for lease in (mine, leased):
            lease.release()
    finally:
        os.close(live_old)


def test_an_old_location_that_is_the_lease_dir_itself_is_not_locked_twice(as_root, tmp_path):
    """<jail dir>/uids linked (or bound) to the host-wide directory by an operator: locking one
    file twice made every uid look taken (SB008 on every box start)."""
    lease = uids.acquire(uids.UidRange(360000, 1))  # makes the host-wide directory
    lease.release()
    os.symlink(uids.HOST_LOCK_DIR, tmp_path / "uids")
    lease = uids.acquire(uids.UidRange(360000, 2))
    assert lease.uid in (360000, 360001)
    lease.release()
