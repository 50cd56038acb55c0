"""A jail provider's shutdown while its pool is starting a box: the box must not outlive it.
CI caught a service whose SIGTERM exit left a bwrap running: the refill's start returned after
shutdown had closed the pool, and nothing waited for its destroy()."""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import pids_naming

from .conftest import make_provider, wait_for

pytestmark = pytest.mark.jail


def test_shutdown_waits_for_a_pool_box_still_starting() -> None:
    p = make_provider(pool_size=1)
    pool = p._pool
    assert wait_for(lambda: pool.status()["ready"] == 1, timeout=60)
    started, box_dirs = threading.Event(), []
    real_start = pool._start

    def slow_start():  # the box runs; its start has not returned yet when shutdown comes
        box = real_start()
        box_dirs.append(box.box_dir)
        started.set()
        time.sleep(1.0)
        return box

    pool._start = slow_start
    taken = pool.take()
    assert taken is not None
    taken.destroy()
    assert started.wait(60)
    assert pids_naming(box_dirs[0])  # the refill's box is running
    p.shutdown()
    assert pids_naming(box_dirs[0]) == []
