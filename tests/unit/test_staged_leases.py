"""Old staged /etc and agent copies are removed only when no live execbox process uses them
(boxes/staged_leases.py): another process's lease, this process's own, a directory from before
leases existed and a sweep racing a new lease all keep a directory in place."""

from __future__ import annotations

import fcntl
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from execbox.boxes import bwrap, staged_leases, staging
from execbox.providers import jail

HOLDER = """
import sys
from execbox.boxes import staged_leases
for path in sys.argv[1:]:
    staged_leases.hold(path)
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def top(tmp_path, monkeypatch):
    monkeypatch.setenv("EXECBOX_JAIL_DIR", str(tmp_path / "jail"))
    monkeypatch.setattr(staged_leases, "_held", {})
    monkeypatch.setattr(bwrap, "_staged_etc", {})
    d = tmp_path / "jail"
    d.mkdir()
    return d


class Holder:
    """Another execbox process that leases ``paths`` until it is closed."""

    def __init__(self, *paths: os.PathLike) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, *map(str, paths)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline() == "held\n"

    def close(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0


def staged(top, name: str):
    d = top / name
    d.mkdir()
    (d / "passwd").write_text("root:x:0:0::/:/bin/sh\n")
    return d


def test_a_directory_another_process_uses_stays_until_that_process_exits(top):
    old = staged(top, "box-etc-0000000000000001")
    holder = Holder(old)
    try:
        assert staged_leases.sweep(str(top)) == []
        assert (old / "passwd").is_file()
    finally:
        holder.close()
    assert staged_leases.sweep(str(top)) == [str(old)]
    assert sorted(os.listdir(top)) == []  # the directory and its lease


def test_this_process_keeps_what_it_leased(top):
    mine = staged(top, "box-etc-0000000000000002")
    staged_leases.hold(str(mine))
    assert staged_leases.sweep(str(top)) == []
    assert (mine / "passwd").is_file()
    # owner only: flock needs just read access, and an exclusive lock by another host user would stall
    # box starts
    assert os.stat(f"{mine}{staged_leases.LEASE}").st_mode & 0o777 == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to try the lease as another host user")
def test_another_host_user_cannot_lock_a_lease_and_stall_box_starts():
    top = tempfile.mkdtemp(prefix="execbox-lease-")  # traversable by all, as /var/lib/execbox is
    try:
        os.chmod(top, 0o755)
        mine = staged(pathlib.Path(top), "box-etc-0000000000000008")
        staged_leases.hold(str(mine))
        attack = ("import fcntl, os, sys\n"
                  "print(len(open(sys.argv[1]).read()) > 0)\n"  # it does reach the directory
                  "try:\n    fd = os.open(sys.argv[2], os.O_RDONLY)\n"
                  "except PermissionError:\n    print('refused'); sys.exit()\n"
                  "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nprint('locked')\n")
        out = subprocess.run(["/usr/bin/python3", "-I", "-c", attack, str(mine / "passwd"),
                              f"{mine}{staged_leases.LEASE}"],
                             user=65534, group=65534, capture_output=True, text=True, timeout=30)
        assert out.stdout == "True\nrefused\n", out
    finally:
        os.close(staged_leases._held.pop(os.path.join(top, "box-etc-0000000000000008")))
        shutil.rmtree(top)


def test_a_directory_from_before_leases_is_left_alone(top):
    legacy = staged(top, "box-etc")  # an older execbox's boxes may still mount it
    assert staged_leases.sweep(str(top)) == []
    assert (legacy / "passwd").is_file()


def test_a_lease_taken_while_a_sweep_removes_the_directory_is_on_the_new_lease_file(top):
    path = str(top / "box-etc-0000000000000003")
    lease = path + staged_leases.LEASE
    sweeper = os.open(lease, os.O_RDONLY | os.O_CREAT, 0o644)
    fcntl.flock(sweeper, fcntl.LOCK_EX)  # a sweep in progress holds the old lease
    t = threading.Thread(target=staged_leases.hold, args=(path,))
    t.start()
    time.sleep(0.2)  # hold() has opened the old lease file and waits for its lock
    os.unlink(lease)  # what _sweep_one does before it unlocks
    os.close(sweeper)
    t.join(timeout=10)
    assert not t.is_alive()
    assert os.fstat(staged_leases._held[path]).st_ino == os.stat(lease).st_ino
    holder_sweep = subprocess.run([sys.executable, "-c",
                                   "import sys; from execbox.boxes import staged_leases as s; "
                                   "print(s.sweep(sys.argv[1]))", str(top)],
                                  capture_output=True, text=True, check=True)
    assert holder_sweep.stdout == "[]\n"  # our lease is on the file other processes find


def test_leftovers_of_an_interrupted_sweep_and_a_crashed_staging_go(top):
    dead = subprocess.Popen(["true"])
    dead.wait()
    trash = staged(top, f"box-etc-0000000000000004.trash-{dead.pid}-abcdef")
    busy_trash = staged(top, f"box-etc-0000000000000005.trash-{os.getpid()}-abcdef")  # a live sweep's
    old_tmp = staged(top, "box-etc-0000000000000006.tmp-1-abcdef")
    young_tmp = staged(top, "box-etc-0000000000000007.tmp-2-abcdef")  # a staging in progress
    hour_ago = time.time() - staged_leases.STALE_TMP_AGE - 60
    os.utime(old_tmp, (hour_ago, hour_ago))
    staged_leases.sweep(str(top), lambda n: n.startswith("box-etc") and ".tmp-" in n)
    assert not trash.exists() and not old_tmp.exists()
    assert busy_trash.exists() and young_tmp.exists()


def test_the_jail_provider_sweep_keeps_the_current_copies_and_removes_unused_old_ones(top, monkeypatch):
    monkeypatch.setattr(jail, "_swept", False)
    etc_before_change = staged(top, "box-etc-00000000000000aa")
    (top / "agent").mkdir()
    agent_before_upgrade = staged(top / "agent", "0123456789abcdef")
    in_use = staged(top, "box-etc-00000000000000bb")
    for d in (etc_before_change, agent_before_upgrade):  # staged and leased by a process since gone
        h = Holder(d)
        h.close()
    holder = Holder(in_use)
    try:
        staging.staged_agent()  # as JailProvider.initialize does before its sweep
        jail._sweep_staged_once()
        assert not etc_before_change.exists() and not agent_before_upgrade.exists()
        assert (in_use / "passwd").is_file()
        current = [bwrap.staged_etc(), staging.staged_agent()]
        for d in current:
            assert os.path.isdir(d) and staged_leases.held(d)
        jail._swept = False
        jail._sweep_staged_once()  # a second start: its own current copies are never swept
        assert all(os.path.isdir(d) for d in current)
    finally:
        holder.close()
