"""Watching the owner of a session while a request is forwarded to it (``forwarding.py``).

A forwarded request keeps a long read timeout: a run of a live owner may legitimately last an
hour. But an owner that is frozen (SIGSTOP, a hung process, a paused VM, a cgroup freezer) still
has its listen backlog accept the connection, and the request would hang as long as it stays
frozen, holding the caller and its tenant request slot, long after another replica could have
taken the session over. So while the request is in flight the forwarding replica reads the
session's row every ``WATCH_EVERY`` of a lease: once the owner's lease has run out without
being renewed (a live owner renews it every quarter lease, and fences itself before it ends),
or another replica has taken the same row over, the owner is lost and the forward is given up
(503 SB009 ``owner_lost_mid_request``: the request did reach it, so its outcome is unknown).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from .sessions.registry import HELD, SessionRecord

log = logging.getLogger("execbox.service.forwarding")

WATCH_EVERY = 1 / 4
"""Fraction of the lease between two reads of the session's row during a forward."""


class OwnerWatch:
    """``lost(details)`` returns once the owner named in a "served by replica" error's details
    is lost; it never returns while that owner keeps its lease."""

    def __init__(self, lookup: Callable[[str, str], SessionRecord | None], lease_ttl: float) -> None:
        self.lookup = lookup
        self.every = max(0.05, lease_ttl * WATCH_EVERY)

    async def lost(self, details: dict[str, Any]) -> None:
        tenant, session, owner = details.get("tenant_id"), details.get("session_id"), details.get("owner")
        if not (isinstance(tenant, str) and isinstance(session, str) and isinstance(owner, str)):
            await asyncio.Event().wait()  # nothing to watch: the read timeout alone bounds the hop
        began = time.time()  # a row made after this is a new session of the name, not the one forwarded for
        while True:
            await asyncio.sleep(self.every)
            try:
                rec = await asyncio.to_thread(self.lookup, tenant, session)
            except Exception as e:  # noqa: BLE001 - the registry is unreachable: nothing can be told
                log.debug("watching the owner of %s/%s: %s", tenant, session, e)
                continue
            if rec is None or rec.state not in HELD:
                continue  # destroyed, or being destroyed (by the owner itself, perhaps this very request)
            if rec.owner == owner:
                if not rec.lease_live():
                    log.warning("the owner %s of %s/%s let its lease run out during a forwarded request; "
                                "giving the request up", owner, tenant, session)
                    return
            elif rec.created_at <= began:
                log.warning("session %s/%s was taken over from %s during a forwarded request; giving it up",
                            tenant, session, owner)
                return
