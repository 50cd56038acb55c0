"""Fixtures for egress tests: the fake internet and jail providers with network policies."""

from __future__ import annotations

import pytest

from tests.conftest import require


def _net_ready() -> None:
    from execbox.boxes import netns

    ok, why = netns.available()
    require(ok, f"box networking ({why})")


@pytest.fixture(scope="package")
def fakenet():
    _net_ready()
    from tests import fakenet as fk

    with fk.serving() as fn:
        yield fn


def jail_with(network: str, allow: list[str] | None = None):
    from tests.integration.jail.conftest import make_provider

    return make_provider(network=network, network_allow=allow or [])


def audited(pred, timeout: float = 5.0, **filters):  # type: ignore[no-untyped-def]
    """Audit records matching ``filters`` once one satisfies ``pred`` (a record is written when its
    connection has closed, which can be a moment after the client in the box returned)."""
    import time

    from execbox.egress import audit

    deadline = time.monotonic() + timeout
    while True:
        recs = audit.recent(**filters)
        if any(pred(r) for r in recs) or time.monotonic() > deadline:
            return recs
        time.sleep(0.05)
