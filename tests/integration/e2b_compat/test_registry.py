"""The E2B registry against a real SessionManager: deadlines kill, the idle reaper waits."""

from __future__ import annotations

import time

import pytest

IDLE = 3.0
"""The sessions' idle timeout: three of the sweeper's keep-alives (one a second) fit in it."""


class _One:
    def __init__(self, provider) -> None:  # noqa: ANN001
        self.provider = provider

    def current(self):  # noqa: ANN201
        return self.provider

    def candidates(self):  # noqa: ANN201
        return [self.provider]


@pytest.fixture
def sessions(local_provider, tmp_path):  # noqa: ANN001, ANN201
    from execbox.service.config import ServiceSettings
    from execbox.service.sessions import SessionManager

    mgr = SessionManager(_One(local_provider), ServiceSettings(idle_timeout=IDLE), str(tmp_path))
    mgr.start()
    yield mgr
    mgr.shutdown()


def test_idle_reaper_leaves_a_live_sandbox_and_deadline_kills_it(sessions) -> None:  # noqa: ANN001
    from execbox.service.e2b_compat.registry import E2BSandbox, Registry

    reg = Registry(sessions, sweep_every=0.1)
    keep = E2BSandbox("keep", "t", "base", {}, {}, time.time() + 60)
    short = E2BSandbox("short", "t", "base", {}, {}, time.time() + 1)
    idle = ("t", "plain")  # an ordinary session, not an E2B sandbox: the reaper takes it
    for sb in (keep, short):
        with sessions.session(sb.tenant_id, sb.session_id):
            pass
        reg.add(sb)
    with sessions.session(*idle):
        pass
    started = time.monotonic()
    try:
        deadline = started + 30
        while not (sessions.get(*idle) is None and reg.get("short") is None) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sessions.get(*idle) is None  # reaped
        assert reg.get("short") is None and sessions.get("t", "e2b-short") is None  # deadline passed
        # the ordinary session, used after `keep` was, is gone: `keep` was kept alive; it stays
        # so for two idle timeouts in all (a keep-alive that stopped after the first would show)
        while time.monotonic() < started + 2 * IDLE:
            assert sessions.get("t", "e2b-keep") is not None  # kept alive past idle_timeout
            time.sleep(0.05)
        assert sessions.get("t", "e2b-keep") is not None and reg.get("keep") is keep
    finally:
        reg.stop()
