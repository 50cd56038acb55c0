"""Host uid leases for jail boxes (boxes/uids.py): distinct while held, shared across processes
through flock, given back on release or death, SB008 when the range is used up."""

from __future__ import annotations

import subprocess
import sys

import pytest

from execbox.boxes import uids
from execbox.errors import InvalidConfigError, RateLimitError


@pytest.fixture(autouse=True)
def own_lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EXECBOX_JAIL_DIR", str(tmp_path))
    monkeypatch.delenv("EXECBOX_JAIL_HOST_UID", raising=False)
    monkeypatch.delenv("EXECBOX_JAIL_UID_RANGE", raising=False)


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
lease = uids.acquire(uids.UidRange(int(sys.argv[1]), 2))
print(lease.uid, flush=True)
sys.stdin.read()   # hold until the test closes our stdin, or kills us
"""


def test_a_lease_held_by_another_process_is_skipped_and_freed_when_it_dies():
    first = 310000
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(first)], stdin=subprocess.PIPE,
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
