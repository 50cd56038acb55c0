"""E2B sandboxes as execbox sessions: id -> (tenant, session, metadata, deadline, access token).

An E2B sandbox *is* an execbox session named ``e2b-<id>`` in the owning tenant; this registry
only keeps what E2B adds on top (template name, metadata, env vars, the kill deadline and the
per-sandbox access token the SDK sends to the sandbox URL). Expired sandboxes are destroyed by
a sweeper thread, the same way ``set_timeout`` moves the deadline; until then the sweeper keeps
the session in use often enough (every third of SANDBOX_IDLE_TIMEOUT) that the service's idle
reaper does not take the sandbox's box and workspace first. The sweeper also kills a sandbox
whose creating execbox token was revoked (creator.py), as the sandbox URL refuses it already.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import string
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ...errors import SandboxError
from ..sessions import SessionManager
from .creator import TokenLiveness

log = logging.getLogger("execbox.service.e2b")

ENVD_VERSION = "0.5.7"
"""The envd protocol level we answer as: octet-stream uploads, stdin close, default user."""

MAX_TIMEOUT = 86400
_ALPHABET = string.ascii_lowercase + string.digits


def new_sandbox_id() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(20))


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


@dataclass
class E2BSandbox:
    sandbox_id: str
    tenant_id: str
    template: str
    metadata: dict[str, str]
    env_vars: dict[str, str]
    end_at: float
    token_id: str | None = None  # the execbox token that created it: runs are audited under it
    access_token: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)
    started_at: float = field(default_factory=time.time)
    kept_alive: float = field(default_factory=time.time)
    session_created: float | None = None
    """The created_at of the session the sandbox started (create sets it): a session of the same
    name made later (after an admin DELETE, say) is not this sandbox's."""
    paused_left: float | None = None
    """Seconds of its timeout left when it was paused; None while it runs. A paused sandbox does
    not time out (as in E2B); the session's paused retention bounds it instead."""
    state: str = "running"

    @property
    def session_id(self) -> str:
        return f"e2b-{self.sandbox_id}"

    def token_ok(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.access_token.encode())

    def listed(self) -> dict[str, Any]:
        return {"templateID": self.template, "alias": self.template, "sandboxID": self.sandbox_id,
                "clientID": "execbox", "startedAt": iso(self.started_at), "endAt": iso(self.end_at),
                "cpuCount": 1, "memoryMB": 512, "diskSizeMB": 1024, "state": self.state,
                "envdVersion": ENVD_VERSION, "metadata": dict(self.metadata)}

    def created(self) -> dict[str, Any]:
        return {"templateID": self.template, "alias": self.template, "sandboxID": self.sandbox_id,
                "clientID": "execbox", "envdVersion": ENVD_VERSION, "envdAccessToken": self.access_token,
                "trafficAccessToken": self.access_token}

    def detail(self) -> dict[str, Any]:
        return {**self.listed(), "envdAccessToken": self.access_token}


class Registry:
    def __init__(self, sessions: SessionManager, sweep_every: float = 1.0,
                 creators: TokenLiveness | None = None) -> None:
        self.sessions = sessions
        self.creators = creators
        """Validity of the creating tokens; None (no store) checks nothing."""
        self._boxes: dict[str, E2BSandbox] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sweep_every = sweep_every
        self._thread: threading.Thread | None = None

    def add(self, sb: E2BSandbox) -> None:
        with self._lock:
            self._boxes[sb.sandbox_id] = sb
        self.start()

    def get(self, sandbox_id: str) -> E2BSandbox | None:
        """The sandbox, or None when it is unknown or its session was destroyed under it."""
        with self._lock:
            sb = self._boxes.get(sandbox_id)
        if sb is None or self._session_alive(sb):
            return sb
        self._gone(sb)
        return None

    def _session_alive(self, sb: E2BSandbox) -> bool:
        """Whether the session the sandbox started still exists (this replica's table first; the
        registry only when it is not here, e.g. paused). A destroyed one (admin DELETE,
        `execbox session rm`, an expiry) ends the sandbox: it never goes on in a new workspace."""
        if sb.session_created is None:
            return True
        s = self.sessions.get(sb.tenant_id, sb.session_id)
        if s is not None and not s.closed:
            created = s.created_at
        else:
            try:
                rec = self.sessions.registry.get(sb.tenant_id, sb.session_id)
            except Exception:  # noqa: BLE001 - a registry hiccup is not proof the session is gone
                log.debug("looking up the session of e2b sandbox %s failed", sb.sandbox_id, exc_info=True)
                return True
            if rec is None:
                return False
            created = rec.created_at
        return abs(created - sb.session_created) < 1e-3

    def _gone(self, sb: E2BSandbox) -> None:
        """Forget a sandbox whose session was destroyed; a session of its name that a request
        in flight made meanwhile is destroyed too (in the background: callers may be async)."""
        with self._lock:
            if self._boxes.get(sb.sandbox_id) is not sb:
                return
            del self._boxes[sb.sandbox_id]
        log.info("e2b sandbox %s ended: its session was destroyed", sb.sandbox_id)

        def sweep() -> None:
            s = self.sessions.get(sb.tenant_id, sb.session_id)
            if s is None:
                return
            try:
                self.sessions.destroy(sb.tenant_id, sb.session_id)
            except SandboxError:
                pass

        threading.Thread(target=sweep, name="execbox-e2b-orphan", daemon=True).start()

    def owned(self, sandbox_id: str, tenant_id: str) -> E2BSandbox | None:
        """The sandbox if this tenant owns it; another tenant's looks exactly like a missing one."""
        sb = self.get(sandbox_id)
        return sb if sb is not None and sb.tenant_id == tenant_id else None

    def creator_cached(self, sb: E2BSandbox) -> bool | None:
        """Whether the sandbox's creating token is valid, when that is known without the store."""
        if self.creators is None or sb.token_id is None:
            return True
        return self.creators.cached(sb.token_id)

    def creator_valid(self, sb: E2BSandbox) -> bool:
        """Whether the creating token is still valid (blocking; raises when the store fails)."""
        if self.creators is None or sb.token_id is None:
            return True
        return self.creators.check(sb.token_id)

    def of_tenant(self, tenant_id: str) -> list[E2BSandbox]:
        with self._lock:
            mine = [s for s in self._boxes.values() if s.tenant_id == tenant_id]
        return [s for s in mine if self.get(s.sandbox_id) is s]

    def kill(self, sb: E2BSandbox) -> bool:
        with self._lock:
            if self._boxes.pop(sb.sandbox_id, None) is None:
                return False
        try:
            self.sessions.destroy(sb.tenant_id, sb.session_id)
        except SandboxError:  # never used, or already reaped: nothing left to destroy
            pass
        return True

    # -- deadline sweeper -------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="execbox-e2b-sweeper", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def session_state(self, sb: E2BSandbox) -> str | None:
        """The state of the sandbox's session (``running``, ``paused``, ...), None when it is gone."""
        s = self.sessions.get(sb.tenant_id, sb.session_id)
        if s is not None and not s.closed:
            return s.state
        rec = self.sessions.registry.get(sb.tenant_id, sb.session_id)
        return rec.state if rec is not None else None

    def paused(self, sb: E2BSandbox) -> None:
        """The sandbox's session was just paused: its timeout stops until it runs again."""
        sb.paused_left = max(0.0, sb.end_at - time.time())
        sb.state = "paused"

    def resumed(self, sb: E2BSandbox, timeout: float | None = None) -> None:
        """It runs again: ``timeout`` seconds from now, else what was left of it at the pause."""
        left = sb.paused_left if sb.paused_left is not None else max(0.0, sb.end_at - time.time())
        sb.end_at = time.time() + (timeout if timeout is not None else left)
        sb.paused_left, sb.state = None, "running"

    def _follow_pause(self, sb: E2BSandbox) -> None:
        """A paused sandbox resumed by its session's use (envd calls, the session API) runs again
        with its timeout's remainder; one paused through the session API stops its timeout too."""
        try:
            state = self.session_state(sb)
        except Exception:  # noqa: BLE001 - a registry hiccup: looked at again at the next sweep
            return
        if state == "paused" and sb.paused_left is None:
            self.paused(sb)
        elif state not in (None, "paused") and sb.paused_left is not None:
            self.resumed(sb)

    def _keepalive(self, sb: E2BSandbox) -> None:
        """Use the session (public API) so the idle reaper leaves a sandbox alone until its deadline."""
        if self.get(sb.sandbox_id) is not sb:  # killed, or its session destroyed: never recreate it
            return
        try:
            with self.sessions.session(sb.tenant_id, sb.session_id):
                pass
        except Exception:  # noqa: BLE001 - a dead box is reported on the sandbox's next real use
            log.debug("keepalive of e2b sandbox %s failed", sb.sandbox_id, exc_info=True)

    def _loop(self) -> None:
        keepalive_every = max(1.0, self.sessions.settings.idle_timeout / 3)
        while not self._stop.wait(self._sweep_every):
            now = time.time()
            with self._lock:
                boxes = list(self._boxes.values())
            for sb in boxes:
                self._follow_pause(sb)
            # a paused sandbox neither times out nor is kept alive (a use would resume it)
            due = [s for s in boxes if s.paused_left is None and s.end_at <= now]
            stale = [s for s in boxes if s.paused_left is None and s.end_at > now
                     and now - s.kept_alive >= keepalive_every]
            for sb in stale:
                sb.kept_alive = now
                threading.Thread(target=self._keepalive, args=(sb,), daemon=True,
                                 name="execbox-e2b-keepalive").start()
            for sb in due:
                try:
                    self.kill(sb)
                    log.info("e2b sandbox %s reached its timeout; killed", sb.sandbox_id)
                except Exception:  # noqa: BLE001 - keep sweeping
                    log.exception("killing expired e2b sandbox %s failed", sb.sandbox_id)
            self._kill_of_revoked_tokens()

    def _kill_of_revoked_tokens(self) -> None:
        """Kill the sandboxes whose creating token was revoked (at most one lookup per token per
        TTL); a store that cannot answer is no proof of revocation, so those are left for later."""
        if self.creators is None:
            return
        with self._lock:
            boxes = [s for s in self._boxes.values() if s.token_id is not None]
        for sb in boxes:
            try:
                if self.creator_valid(sb):
                    continue
            except Exception:  # noqa: BLE001 - retried at the next sweep
                log.debug("checking the token of e2b sandbox %s failed", sb.sandbox_id, exc_info=True)
                continue
            try:
                if self.kill(sb):
                    log.info("e2b sandbox %s killed: the API token that created it was revoked",
                             sb.sandbox_id)
            except Exception:  # noqa: BLE001 - keep sweeping
                log.exception("killing e2b sandbox %s of a revoked token failed", sb.sandbox_id)
