"""A session's metadata tells its tenant whether the jail's warm pool is failing, but not the
failure's host paths: those go to the server log and the operator's reports only."""

from __future__ import annotations

import errno
import time

from tests.integration.jail.conftest import SMALL, jail_ready

SECRET = "/var/lib/execbox-secret/jail/boxes/b-1/workspace.img"


def test_a_failing_pools_error_reaches_the_tenant_without_host_paths():
    from execbox.providers.jail import JailProvider

    jail_ready()
    p = JailProvider()

    def failing_start():
        raise OSError(errno.ENOSPC, "No space left on device", SECRET)

    p.start_pooled_box = failing_start  # the pool's starter, taken at initialize
    p.initialize({**SMALL, "pool_size": 1})
    try:
        deadline = time.monotonic() + 10
        while p.pool_status()["last_error"] is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert SECRET in p.pool_status()["last_error"]  # the operator's view stays whole
        inst = p.create_instance(tenant_id="t", session_id="s")  # a session box starts cold
        pool = inst.metadata["pool"]
        assert pool["healthy"] is False and pool["last_error"] == "No space left on device"
        assert "execbox-secret" not in repr(inst.metadata)
    finally:
        p.shutdown()

