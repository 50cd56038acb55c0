"""The E2B endpoint's sweeper: deadlines, keep-alives, pause state, revoked tokens, orphans.

One thread per replica, once a second. With a store every replica sees every sandbox's row, so
each acts only where it should: a sandbox whose session another live replica owns is that
replica's (its kill raises SessionOwnedElsewhere and is left there); keep-alives and pause
tracking are for sessions loaded here; the in-memory cache keeps only what this replica uses.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..sessions.model import SessionOwnedElsewhere

log = logging.getLogger("execbox.service.e2b")

CACHE_IDLE = 60.0
"""Seconds a cached sandbox whose session is not loaded here stays cached after its last read."""
ORPHAN_EVERY = 10.0
ENDED_KEPT = 600.0
"""Seconds a replica remembers a sandbox it ended, to destroy a session of its name made after."""


class SweeperMixin:
    """For :class:`~execbox.service.e2b_compat.registry.Registry` (its attributes and methods)."""

    sessions: Any
    store: Any
    creators: Any
    _boxes: dict[str, Any]
    _ended: dict[str, tuple[str, float]]
    _lock: threading.Lock
    _stop: threading.Event
    _sweep_every: float
    _thread: threading.Thread | None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="execbox-e2b-sweeper", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _loaded(self, sb: Any) -> bool:
        s = self.sessions.get(sb.tenant_id, sb.session_id)
        return s is not None and not s.closed

    def _follow_pause(self, sb: Any) -> None:
        """A paused sandbox resumed by its session's use (envd calls, the session API) runs again
        with its timeout's remainder; one paused through the session API stops its timeout too.
        Only for sessions loaded here (no query): that is where such a change happens."""
        s = self.sessions.get(sb.tenant_id, sb.session_id)
        if s is None or s.closed:
            return
        try:
            if s.state == "paused" and sb.paused_left is None:
                self.paused(sb)  # type: ignore[attr-defined]
            elif s.state != "paused" and sb.paused_left is not None:
                self.resumed(sb)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - a store hiccup: looked at again at the next sweep
            log.debug("e2b sandbox %s: recording its pause state failed", sb.sandbox_id, exc_info=True)

    def _keepalive(self, sb: Any) -> None:
        """Use the session (public API) so the idle reaper leaves a sandbox alone until its deadline."""
        if self.get(sb.sandbox_id) is not sb:  # type: ignore[attr-defined]  # killed, or its session gone
            return
        try:
            with self.sessions.session(sb.tenant_id, sb.session_id):
                pass
        except Exception:  # noqa: BLE001 - a dead box is reported on the sandbox's next real use
            log.debug("keepalive of e2b sandbox %s failed", sb.sandbox_id, exc_info=True)

    def _mine_to_keep(self, sb: Any) -> bool:
        """Loaded here, or owned by no live replica (then this one adopts it); not another's."""
        if self._loaded(sb):
            return True
        try:
            self.sessions.check_owner(sb.tenant_id, sb.session_id)
        except SessionOwnedElsewhere:
            return False
        except Exception:  # noqa: BLE001 - asked again at the next scan
            return False
        return True

    def _loop(self) -> None:
        keepalive_every = max(1.0, self.sessions.settings.idle_timeout / 3)
        last_scan = last_orphans = 0.0
        while not self._stop.wait(self._sweep_every):
            now = time.time()
            with self._lock:
                cached = list(self._boxes.values())
            for sb in cached:
                self._follow_pause(sb)
            # a paused sandbox neither times out nor is kept alive (a use would resume it)
            if self.store is None:
                due = [s for s in cached if s.paused_left is None and s.end_at <= now]
                stale = [s for s in cached if s.paused_left is None and s.end_at > now
                         and now - s.kept_alive >= keepalive_every]
            else:  # every replica's sandboxes: the row is the truth (another may have moved a deadline)
                due = self._rows(self.store.repo.due, now)
                stale = []
                if now - last_scan >= keepalive_every:
                    last_scan = now
                    stale = [sb for sb in self._rows(self.store.repo.running, now) if self._mine_to_keep(sb)]
                if now - last_orphans >= ORPHAN_EVERY:
                    last_orphans = now
                    self._reap_orphans()
                self._trim_cache()
            for sb in stale:
                sb.kept_alive = now
                threading.Thread(target=self._keepalive, args=(sb,), daemon=True,
                                 name="execbox-e2b-keepalive").start()
            for sb in due:
                self._kill_quietly(sb, "reached its timeout")
            self._kill_of_revoked_tokens()

    def _kill_quietly(self, sb: Any, why: str) -> None:
        try:
            if self.kill(sb):  # type: ignore[attr-defined]
                log.info("e2b sandbox %s %s; killed", sb.sandbox_id, why)
        except SessionOwnedElsewhere:  # that replica's sweeper kills it
            log.debug("e2b sandbox %s %s; it is served by another replica", sb.sandbox_id, why)
        except Exception:  # noqa: BLE001 - keep sweeping
            log.exception("killing e2b sandbox %s (%s) failed", sb.sandbox_id, why)

    def _rows(self, query: Any, *args: Any) -> list[Any]:
        """The sandboxes of the rows ``query(*args)`` returns; none when the store cannot answer now."""
        try:
            rows = query(*args)
        except Exception:  # noqa: BLE001 - swept again a second later
            log.debug("e2b sandbox sweep: the store did not answer", exc_info=True)
            return []
        return [sb for sb in (self._load(str(r["sandbox_id"]), r) for r in rows)  # type: ignore[attr-defined]
                if sb is not None]

    def _trim_cache(self) -> None:
        """Forget cached sandboxes this replica has not read for a while and whose sessions are
        not loaded here (another replica's, or gone): the cache holds what this replica uses."""
        cutoff = time.monotonic() - CACHE_IDLE
        with self._lock:
            old = [sb for sb in self._boxes.values() if sb.read_at < cutoff]
        for sb in old:
            if not self._loaded(sb):
                with self._lock:  # unless a request read it meanwhile
                    if self._boxes.get(sb.sandbox_id) is sb and sb.read_at < cutoff:
                        del self._boxes[sb.sandbox_id]

    def _reap_orphans(self) -> None:
        """Destroy a session loaded here that belongs to a sandbox this replica ended (killed,
        or its session destroyed): a request that waited on the session while the sandbox went
        starts it afresh (sessions.manager._held), and nothing would use or end it. Only such
        sessions: a tenant's own session may be named ``e2b-...`` too."""
        now = time.time()
        with self._lock:
            for sid in [k for k, (_, when) in self._ended.items() if now - when > ENDED_KEPT]:
                del self._ended[sid]
            ended = dict(self._ended)
        if not ended:
            return
        for tenant, session_id, _created in self.sessions.loaded_sessions("e2b-"):
            if ended.get(session_id[4:], ("",))[0] != tenant:
                continue
            try:
                if self.store.repo.get(session_id[4:]) is not None:  # a new sandbox of that id
                    continue
            except Exception:  # noqa: BLE001 - looked at again later
                continue
            log.info("destroying session %s/%s: its e2b sandbox is gone", tenant, session_id)
            threading.Thread(target=self._destroy_quietly, args=(tenant, session_id), daemon=True,
                             name="execbox-e2b-orphan").start()

    def _destroy_quietly(self, tenant: str, session_id: str) -> None:
        try:
            self.sessions.destroy(tenant, session_id)
        except Exception:  # noqa: BLE001 - gone already, or busy elsewhere: looked at again later
            log.debug("destroying orphan session %s/%s failed", tenant, session_id, exc_info=True)

    def _kill_of_revoked_tokens(self) -> None:
        """Kill the sandboxes whose creating token was revoked (at most one lookup per token per
        TTL); a store that cannot answer is no proof of revocation, so those are left for later."""
        if self.creators is None:
            return
        if self.store is not None:
            try:
                pairs = self.store.repo.token_ids()
            except Exception:  # noqa: BLE001 - swept again a second later
                return
        else:
            with self._lock:
                pairs = [(s.sandbox_id, s.token_id) for s in self._boxes.values() if s.token_id is not None]
        verdicts: dict[str, bool] = {}
        for sandbox_id, token_id in pairs:
            if token_id not in verdicts:
                try:
                    verdicts[token_id] = self.creators.check(token_id)
                except Exception:  # noqa: BLE001 - retried at the next sweep
                    log.debug("checking API token %s failed", token_id, exc_info=True)
                    verdicts[token_id] = True
            if verdicts[token_id]:
                continue
            sb = self.get(sandbox_id)  # type: ignore[attr-defined]
            if sb is not None:
                self._kill_quietly(sb, "was made with an API token that was revoked")
