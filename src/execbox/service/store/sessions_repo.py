"""The SQL session registry (table ``sessions``, migration 0003) and replica heartbeats.

Every decision that must hold across replicas is taken inside one transaction under the
database's own locks: session creates (quota counts) under a transaction-scoped advisory lock
on PostgreSQL (the store's write-lock row elsewhere), ownership changes with
``SELECT ... FOR UPDATE SKIP LOCKED`` so two replicas never adopt the same row.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from sqlalchemy import case, delete, func, or_, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from ..sessions.registry import ACTIVE, HELD, SessionRecord, new_id, quota_error
from .models import Replica, SessionRow, SystemSetting
from .repos import LOCK_ROW, REGISTRY_ID_ROW, _lock_for_write

CREATE_LOCK = 0x65786273  # "exbs": advisory lock key serialising session creates (quota counts)

_JSON_FIELDS = ("box_handle", "network_policy")


def _record(row: SessionRow) -> SessionRecord:
    return SessionRecord(
        id=row.id, tenant_id=row.tenant_id, session_id=row.session_id, state=row.state, provider=row.provider,
        box_handle=json.loads(row.box_handle or "{}"), runtime=row.runtime,
        network_policy=json.loads(row.network_policy or "{}"), owner=row.owner,
        lease_expires=row.lease_expires, contexts_lost=bool(row.contexts_lost), created_at=float(row.created_at),
        last_used=float(row.last_used), expires_at=row.expires_at)


class SqlSessionRegistry:
    """The ``sessions`` table behind SessionManager: survives restarts, shared by replicas."""

    persistent = True

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions
        self._engine = sessions.kw["bind"]
        self._dialect = self._engine.dialect.name
        # Single-statement writes need no BEGIN/COMMIT round trips: the statement is the transaction.
        self._auto = self._engine.execution_options(isolation_level="AUTOCOMMIT")

    def identity(self) -> str:
        """This registry's id, made once per database (under the store's write lock, so replicas
        starting together agree). It names the directory holding this registry's workspaces:
        services on one host with different databases never touch each other's. Written with
        update_time 0 so it does not bump the settings version (no hot reload)."""
        with self._sessions() as s:
            value = s.scalar(select(SystemSetting.value).where(SystemSetting.name == REGISTRY_ID_ROW))
        if value:
            return value
        with self._sessions.begin() as s:
            _lock_for_write(s)
            value = s.scalar(select(SystemSetting.value).where(SystemSetting.name == REGISTRY_ID_ROW))
            if not value:
                value = "reg-" + uuid.uuid4().hex[:12]
                s.add(SystemSetting(name=REGISTRY_ID_ROW, source="store", data_type="string", value=value,
                                    update_time=0.0))
            return value

    def _lock_rows(self, s: Session) -> None:
        """SQLite has no row locks: take its database write lock first (a no-op elsewhere)."""
        if self._dialect == "sqlite":
            _lock_for_write(s)

    def get(self, tenant_id: str, session_id: str) -> SessionRecord | None:
        with self._sessions() as s:
            row = s.scalar(select(SessionRow).where(SessionRow.tenant_id == tenant_id,
                                                    SessionRow.session_id == session_id))
            return _record(row) if row else None

    def list(self, tenant_id: str | None = None) -> list[SessionRecord]:
        q = select(SessionRow).order_by(SessionRow.tenant_id, SessionRow.session_id)
        if tenant_id is not None:
            q = q.where(SessionRow.tenant_id == tenant_id)
        with self._sessions() as s:
            return [_record(r) for r in s.scalars(q)]

    def create(self, tenant_id: str, session_id: str, *, provider: str | None, runtime: str | None,
               owner: str, lease_ttl: float, tenant_limit: int, global_limit: int) -> tuple[SessionRecord, bool]:
        """Core statements in one transaction (no ORM unit of work: this is on the create path):
        the create lock, one query for the existing row and both quota counts, the insert."""
        t = SessionRow.__table__
        mine = (t.c.tenant_id == tenant_id) & (t.c.session_id == session_id)
        for _ in range(2):
            try:
                with self._engine.begin() as conn:
                    if self._dialect == "postgresql":
                        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": CREATE_LOCK})
                    else:
                        conn.execute(update(SystemSetting).where(SystemSetting.name == LOCK_ROW)
                                     .values(source="lock"))
                    exists, held, active = conn.execute(select(  # one round trip: the row and both counts
                        func.coalesce(func.sum(case((mine, 1), else_=0)), 0),
                        func.coalesce(func.sum(case(((t.c.tenant_id == tenant_id) & t.c.state.in_(HELD), 1),
                                                    else_=0)), 0),
                        func.coalesce(func.sum(case((t.c.state.in_(ACTIVE), 1), else_=0)), 0),
                    )).one()
                    if not exists:
                        err = quota_error(tenant_id, int(held), int(active), tenant_limit, global_limit)
                        if err is not None:
                            raise err
                        now = time.time()
                        values = {"id": new_id(), "tenant_id": tenant_id, "session_id": session_id,
                                  "provider": provider, "box_handle": "{}", "runtime": runtime,
                                  "network_policy": "{}", "state": "creating", "owner": owner,
                                  "lease_expires": now + lease_ttl, "contexts_lost": False, "created_at": now,
                                  "last_used": now, "expires_at": None}
                        conn.execute(t.insert().values(**values))
                        return SessionRecord(values["id"], tenant_id, session_id, "creating", provider=provider,
                                             runtime=runtime, owner=owner, lease_expires=values["lease_expires"],
                                             created_at=now, last_used=now), True
            except IntegrityError:  # a create that did not take the lock (should not happen): reread
                continue
            break
        existing = self.get(tenant_id, session_id)
        if existing is None:  # deleted between our transaction and this read: try once more
            return self.create(tenant_id, session_id, provider=provider, runtime=runtime, owner=owner,
                               lease_ttl=lease_ttl, tenant_limit=tenant_limit, global_limit=global_limit)
        return existing, False

    def update(self, tenant_id: str, session_id: str, **fields: Any) -> bool:
        """One UPDATE statement (no read first: this is on the session-create path)."""
        values = {k: (json.dumps(v, sort_keys=True) if k in _JSON_FIELDS else v) for k, v in fields.items()}
        with self._auto.connect() as conn:
            res = conn.execute(update(SessionRow).where(SessionRow.tenant_id == tenant_id,
                                                        SessionRow.session_id == session_id).values(**values))
            return bool(res.rowcount)

    def claim(self, tenant_id: str, session_id: str, owner: str, lease_ttl: float) -> SessionRecord | None:
        now = time.time()
        with self._sessions.begin() as s:
            self._lock_rows(s)
            row = s.scalar(select(SessionRow).where(SessionRow.tenant_id == tenant_id,
                                                    SessionRow.session_id == session_id).with_for_update())
            if row is None:
                return None
            if row.owner not in (None, owner) and (row.lease_expires or 0.0) > now:
                return None
            row.owner, row.lease_expires = owner, now + lease_ttl
            s.flush()
            return _record(row)

    def delete(self, tenant_id: str, session_id: str) -> bool:
        with self._auto.connect() as s:
            res = s.execute(delete(SessionRow).where(SessionRow.tenant_id == tenant_id,
                                                     SessionRow.session_id == session_id))
            return bool(res.rowcount)

    def adoptable(self, owner: str, lease_ttl: float) -> list[SessionRecord]:
        now = time.time()
        with self._sessions.begin() as s:
            self._lock_rows(s)
            rows = list(s.scalars(select(SessionRow).where(
                SessionRow.state.in_(HELD),
                or_(SessionRow.owner == owner, SessionRow.owner.is_(None), SessionRow.lease_expires < now),
            ).with_for_update(skip_locked=True)))
            for row in rows:
                row.owner, row.lease_expires = owner, now + lease_ttl
            s.flush()
            return [_record(r) for r in rows]

    def heartbeat(self, owner: str, lease_ttl: float, last_used: dict[tuple[str, str], float],
                  url: str | None = None) -> set[tuple[str, str]]:
        now = time.time()
        with self._sessions.begin() as s:
            s.execute(update(SessionRow).where(SessionRow.owner == owner, SessionRow.state.in_(HELD))
                      .values(lease_expires=now + lease_ttl))
            for (tenant_id, session_id), used in last_used.items():
                s.execute(update(SessionRow).where(SessionRow.tenant_id == tenant_id,
                                                   SessionRow.session_id == session_id,
                                                   SessionRow.owner == owner).values(last_used=used))
            rep = s.get(Replica, owner)
            if rep is None:
                s.add(Replica(id=owner, url=url, started_at=now, heartbeat=now))
            else:
                rep.heartbeat, rep.url = now, url if url is not None else rep.url
            return {(t, i) for t, i in s.execute(select(SessionRow.tenant_id, SessionRow.session_id)
                                                 .where(SessionRow.owner == owner))}

    def expired(self, now: float) -> list[SessionRecord]:
        with self._sessions() as s:
            return [_record(r) for r in s.scalars(select(SessionRow).where(
                SessionRow.expires_at.is_not(None), SessionRow.expires_at < now))]

    def leave(self, owner: str) -> None:
        with self._sessions.begin() as s:
            s.execute(delete(Replica).where(Replica.id == owner))

    def replicas(self) -> list[dict[str, Any]]:
        with self._sessions() as s:
            return [{"id": r.id, "url": r.url, "started_at": r.started_at, "heartbeat": r.heartbeat}
                    for r in s.scalars(select(Replica).order_by(Replica.id))]
