"""Container removals retried until the engine lets them (boxes/docker_removals.py), with the
engine faked at its boundary: the attempt raises what docker-py raises while dockerd is down."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from execbox.boxes.docker_removals import Removals, engine_unreachable
from execbox.errors import ProviderUnavailableError


class Engine:
    """A container removal that fails while ``down``, then removes and releases once."""

    def __init__(self, down: bool = True, error: Exception | None = None) -> None:
        self.down = down
        self.error = error
        self.tries = 0
        self.released = 0

    def attempt(self) -> None:
        self.tries += 1
        if self.down:
            raise self.error or requests.exceptions.ConnectionError(
                "('Connection aborted.', FileNotFoundError(2, 'No such file or directory'))")
        self.released += 1


def _wait(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_a_failed_removal_is_retried_in_the_background_until_the_engine_is_back():
    r = Removals(first=0.02, most=0.1)
    e = Engine()
    r.add("c1", e.attempt, "/ws/a")
    assert r.pending() == ["c1"] and e.tries == 1
    assert _wait(lambda: e.tries >= 3, 5)
    e.down = False
    assert _wait(lambda: not r.pending(), 5)
    assert e.released == 1
    time.sleep(0.2)
    assert e.released == 1  # done once, never again
    r.close()


def test_settle_finishes_the_workspace_s_removals_or_says_the_engine_is_unavailable():
    r = Removals(first=60, most=60)  # no background retry within this test
    e, other = Engine(), Engine()
    r.add("c1", e.attempt, "/ws/a/")
    r.add("c2", other.attempt, "/ws/b")
    t0 = time.monotonic()
    with pytest.raises(ProviderUnavailableError) as ei:
        r.settle("/ws/a")
    assert time.monotonic() - t0 < 1
    assert ei.value.details["reason"] == "docker_engine_unavailable" and ei.value.code == "SB009"
    e.down = False
    r.settle("/ws/a")
    assert e.released == 1 and r.pending() == ["c2"] and other.tries == 1  # only its own workspace's
    r.close()


def test_settle_leaves_an_engine_refusal_to_the_wait_for_the_mount():
    r = Removals(first=60, most=60)
    e = Engine(error=RuntimeError("500 Server Error: removal of container is already in progress"))
    r.add("c1", e.attempt, "/ws/a")
    r.settle("/ws/a")  # not an unreachable engine: no SB009 here
    assert e.tries == 2 and r.pending("/ws/a") == ["c1"]
    r.close()


def test_settle_and_the_retry_thread_never_run_one_removal_twice_at_once():
    r = Removals(first=0.001, most=0.001)
    inside = threading.Semaphore(0)
    overlap = []
    active = [0]

    def attempt() -> None:
        active[0] += 1
        overlap.append(active[0])
        time.sleep(0.002)
        active[0] -= 1
        inside.release()
        raise requests.exceptions.ConnectionError("down")

    r.add("c1", attempt, "/ws/a")
    for _ in range(20):
        with pytest.raises(ProviderUnavailableError):
            r.settle("/ws/a")
    assert max(overlap) == 1
    r.close()


def test_close_tries_once_more_and_stops_retrying():
    r = Removals(first=0.02, most=0.02)
    e = Engine()
    r.add("c1", e.attempt, None)
    assert r.close() == ["c1"]
    tries = e.tries
    time.sleep(0.1)
    assert e.tries == tries


def test_what_counts_as_an_unreachable_engine():
    assert engine_unreachable(requests.exceptions.ConnectionError("x"))
    assert engine_unreachable(requests.exceptions.ReadTimeout("x"))
    assert engine_unreachable(ConnectionRefusedError())
    assert not engine_unreachable(RuntimeError("409 Conflict"))
