"""E2B sandboxes as execbox sessions: id -> (tenant, session, metadata, deadline, access token).

An E2B sandbox *is* an execbox session named ``e2b-<id>`` in the owning tenant; this registry
only keeps what E2B adds on top (template name, metadata, env vars, the kill deadline and the
per-sandbox access token the SDK sends to the sandbox URL). With a store (the service's
database; persist.py) that is a row every replica reads, kept across restarts; the objects
here are a cache of those rows, read afresh on every lookup. Expired sandboxes are destroyed by
a sweeper thread, the same way ``set_timeout`` moves the deadline; until then the sweeper keeps
the session in use often enough (every third of SANDBOX_IDLE_TIMEOUT) that the service's idle
reaper does not take the sandbox's box and workspace first. The sweeper also kills a sandbox
whose creating execbox token was revoked (creator.py), as the sandbox URL refuses it already.
"""

from __future__ import annotations

import hmac
import logging
import re
import secrets
import string
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ...errors import SandboxError
from ..sessions import SessionManager
from ..sessions.model import SessionOwnedElsewhere
from .creator import TokenLiveness
from .sweeper import SweeperMixin

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .persist import SandboxStore

log = logging.getLogger("execbox.service.e2b")

ENVD_VERSION = "0.5.7"
"""The envd protocol level we answer as: octet-stream uploads, stdin close, default user."""

MAX_TIMEOUT = 86400
_ALPHABET = string.ascii_lowercase + string.digits
_ID = re.compile(r"[a-z0-9]{1,32}")
FRESH = 0.5
"""Seconds a sandbox read from the store is used as it is: a request's several lookups (router,
handler, watchers) cost one query, and what another replica changed shows within this."""


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
    accepted: tuple[str, ...] = field(default=(), repr=False)
    """Older access tokens still valid (made under a secret key that a rotation replaced)."""
    started_at: float = field(default_factory=time.time)
    kept_alive: float = field(default_factory=time.time)
    session_created: float | None = None
    """The created_at of the session the sandbox started (create sets it): a session of the same
    name made later (after an admin DELETE, say) is not this sandbox's."""
    paused_left: float | None = None
    """Seconds of its timeout left when it was paused; None while it runs. A paused sandbox does
    not time out (as in E2B); the session's paused retention bounds it instead."""
    read_at: float = field(default=0.0, repr=False, compare=False)
    """time.monotonic() of the last read of its row (Registry._load)."""

    @property
    def session_id(self) -> str:
        return f"e2b-{self.sandbox_id}"

    @property
    def state(self) -> str:
        """E2B's sandbox state: a paused sandbox is one whose timeout stands."""
        return "paused" if self.paused_left is not None else "running"

    def token_ok(self, presented: str | None) -> bool:
        if presented is None:
            return False
        # every candidate compared, so the time taken does not say which one matched
        matches = [hmac.compare_digest(presented.encode(), t.encode()) for t in (self.access_token, *self.accepted)]
        return any(matches)

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


class Registry(SweeperMixin):
    """The E2B endpoint's sandboxes (see the module docstring); sweeper.py keeps them in time."""

    def __init__(self, sessions: SessionManager, sweep_every: float = 1.0,
                 creators: TokenLiveness | None = None, store: SandboxStore | None = None) -> None:
        self.sessions = sessions
        self.creators = creators
        """Validity of the creating tokens; None (no store) checks nothing."""
        self.store = store
        """Where sandboxes live (persist.py); None: in this process only, gone with it."""
        self._ended: dict[str, tuple[str, float]] = {}
        """Sandboxes this replica ended (id -> tenant, time.time()): a session of such a sandbox's
        name that shows up afterwards is an orphan (sweeper.py), and no other session is."""
        self._boxes: dict[str, E2BSandbox] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sweep_every = sweep_every
        self._thread: threading.Thread | None = None

    def add(self, sb: E2BSandbox) -> None:
        """Record a new sandbox (with a store: its row, and the access token derived for it)."""
        if self.store is not None:
            self.store.insert(sb)
        with self._lock:
            self._boxes[sb.sandbox_id] = sb
        self.start()

    def get(self, sandbox_id: str, fresh: bool = False) -> E2BSandbox | None:
        """The sandbox, or None when it is unknown or its session was destroyed under it.
        ``fresh``: read its row now (the control plane: what another replica just changed shows)."""
        sb = self._load(sandbox_id, fresh=fresh) if self.store is not None else self._cached(sandbox_id)
        if sb is None or self._session_alive(sb):
            return sb
        self._gone(sb)
        return None

    def _cached(self, sandbox_id: str) -> E2BSandbox | None:
        with self._lock:
            return self._boxes.get(sandbox_id)

    def _load(self, sandbox_id: str, row: dict[str, Any] | None = None, fresh: bool = False) -> E2BSandbox | None:
        """The sandbox as its row says now (the same object for as long as it lives: watchers
        compare it), or None when no row exists. A store that cannot answer falls back on what
        was read last, so a database hiccup does not end sandboxes."""
        assert self.store is not None
        if row is None:
            if not _ID.fullmatch(sandbox_id):
                return None
            cached = self._cached(sandbox_id)
            if cached is not None and not fresh and time.monotonic() - cached.read_at < FRESH:
                return cached
            try:
                row = self.store.repo.get(sandbox_id)
            except Exception:  # noqa: BLE001 - see above
                log.warning("looking up e2b sandbox %s in the store failed; using the last known state",
                            sandbox_id, exc_info=True)
                return self._cached(sandbox_id)
        with self._lock:
            if row is None:
                self._boxes.pop(sandbox_id, None)
                return None
            sb = self._boxes.get(sandbox_id)
            if sb is not None:
                self.store.refresh(sb, row)
                sb.read_at = time.monotonic()
                return sb
        made = self.store.sandbox(row)  # decrypts: outside the lock
        made.read_at = time.monotonic()
        with self._lock:
            return self._boxes.setdefault(sandbox_id, made)

    def _save(self, sb: E2BSandbox, **fields: Any) -> None:
        if self.store is not None:
            self.store.repo.update(sb.sandbox_id, **fields)

    def set_deadline(self, sb: E2BSandbox, seconds: float, extend_only: bool = False) -> None:
        """The kill deadline ``seconds`` from now (set_timeout), or at least that far off
        (``extend_only``: refreshes, connect). A paused sandbox's clock stands: what changes is
        the time it has left once it runs again."""
        if sb.paused_left is not None:
            sb.paused_left = max(sb.paused_left, seconds) if extend_only else max(0.0, seconds)
            self._save(sb, paused_left=sb.paused_left)
            return
        end_at = time.time() + seconds
        sb.end_at = max(sb.end_at, end_at) if extend_only else end_at
        self._save(sb, end_at=sb.end_at)

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
        self.ended(sb)
        if self.store is not None:
            try:
                self.store.repo.delete(sb.sandbox_id)
            except Exception:  # noqa: BLE001 - the next lookup finds the session gone again
                log.warning("removing e2b sandbox %s from the store failed", sb.sandbox_id, exc_info=True)
        log.info("e2b sandbox %s ended: its session was destroyed", sb.sandbox_id)
        if self.sessions.get(sb.tenant_id, sb.session_id) is not None:  # made by a request in flight
            threading.Thread(target=self._destroy_quietly, args=(sb.tenant_id, sb.session_id), daemon=True,
                             name="execbox-e2b-orphan").start()

    def owned(self, sandbox_id: str, tenant_id: str) -> E2BSandbox | None:
        """The sandbox, as its row says now, if this tenant owns it; another tenant's looks
        exactly like a missing one."""
        sb = self.get(sandbox_id, fresh=True)
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
        if self.store is not None:
            rows = self.store.repo.of_tenant(tenant_id)
            mine = [sb for sb in (self._load(str(r["sandbox_id"]), r) for r in rows) if sb is not None]
        else:
            with self._lock:
                mine = [s for s in self._boxes.values() if s.tenant_id == tenant_id]
        alive = []
        for sb in mine:
            if self._session_alive(sb):
                alive.append(sb)
            else:
                self._gone(sb)
        return alive

    def kill(self, sb: E2BSandbox) -> bool:
        """Destroy the sandbox's session, then forget the sandbox. When another replica owns the
        session this raises SessionOwnedElsewhere before anything changed (a request is then
        forwarded to that replica, which does the whole kill)."""
        try:
            self.sessions.destroy(sb.tenant_id, sb.session_id)
        except SessionOwnedElsewhere:
            raise
        except SandboxError:  # never used, or already reaped: nothing left to destroy
            pass
        with self._lock:
            known = self._boxes.pop(sb.sandbox_id, None) is not None
        self.ended(sb)
        if self.store is not None:
            known = self.store.repo.delete(sb.sandbox_id) or known
        return known

    def ended(self, sb: E2BSandbox) -> None:
        with self._lock:
            self._ended[sb.sandbox_id] = (sb.tenant_id, time.time())

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
        self._save(sb, paused_left=sb.paused_left)

    def resumed(self, sb: E2BSandbox, timeout: float | None = None) -> None:
        """It runs again: ``timeout`` seconds from now, else what was left of it at the pause."""
        left = sb.paused_left if sb.paused_left is not None else max(0.0, sb.end_at - time.time())
        sb.end_at = time.time() + (timeout if timeout is not None else left)
        sb.paused_left = None
        self._save(sb, end_at=sb.end_at, paused_left=None)
