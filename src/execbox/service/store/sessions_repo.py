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

_PG_CREATE = """
WITH c AS (
    SELECT coalesce(sum(CASE WHEN tenant_id = %(tenant_id)s AND session_id = %(session_id)s THEN 1 ELSE 0 END), 0)
               AS present,
           coalesce(sum(CASE WHEN tenant_id = %(tenant_id)s AND state = ANY(%(held)s) THEN 1 ELSE 0 END), 0) AS held,
           coalesce(sum(CASE WHEN state = ANY(%(active)s) THEN 1 ELSE 0 END), 0) AS active
    FROM sessions
), ins AS (
    INSERT INTO sessions (id, tenant_id, session_id, provider, box_handle, runtime, network_policy, state, owner,
                          lease_expires, contexts_lost, created_at, last_used, expires_at)
    SELECT %(id)s, %(tenant_id)s, %(session_id)s, %(provider)s, '{}', %(runtime)s, '{}', 'creating', %(owner)s,
           %(lease_expires)s, false, %(now)s, %(now)s, NULL
    FROM c WHERE c.present = 0 AND c.held < %(tenant_limit)s AND c.active < %(global_limit)s
    RETURNING 1
)
SELECT present, held, active, (SELECT count(*) FROM ins) FROM c
"""
"""Count and insert in one statement (see SqlSessionRegistry._create_pg_pipeline); bound parameters only."""


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
        self._pipeline = self._dialect == "postgresql" and self._engine.dialect.driver == "psycopg"

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
        if self._pipeline:
            created = self._create_pg_pipeline(tenant_id, session_id, provider, runtime, owner, lease_ttl,
                                               tenant_limit, global_limit)
            if created is not None:
                return created, True
            existing = self.get(tenant_id, session_id)
            if existing is not None:
                return existing, False
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

    def _create_pg_pipeline(self, tenant_id: str, session_id: str, provider: str | None, runtime: str | None,
                            owner: str, lease_ttl: float, tenant_limit: int,
                            global_limit: int) -> SessionRecord | None:
        """PostgreSQL with psycopg 3: the create transaction in ONE network round trip (psycopg's
        pipeline mode): BEGIN, the create lock, then one statement that counts and inserts only
        when the name is free and both quotas allow it, COMMIT. The statements still run one
        after the other on the server, and in READ COMMITTED the counting statement's snapshot
        is taken after the lock is granted, so the counts see every earlier create. Returns the
        new record, or None when the row exists (raises the quota error otherwise)."""
        now = time.time()
        values = {"id": new_id(), "tenant_id": tenant_id, "session_id": session_id, "provider": provider,
                  "runtime": runtime, "owner": owner, "lease_expires": now + lease_ttl, "now": now,
                  "held": list(HELD), "active": list(ACTIVE), "tenant_limit": tenant_limit,
                  "global_limit": global_limit}
        with self._auto.connect() as conn:
            raw = conn.connection.driver_connection
            try:
                with raw.pipeline():
                    raw.execute("BEGIN")
                    raw.execute("SELECT pg_advisory_xact_lock(%s)", (CREATE_LOCK,))
                    cur = raw.execute(_PG_CREATE, values)
                    raw.execute("COMMIT")
                present, held, active, inserted = cur.fetchone()
            except Exception as e:
                try:
                    raw.execute("ROLLBACK")
                except Exception:  # noqa: BLE001 - a broken connection: the pool discards it; raise the cause
                    pass
                if type(e).__name__ == "UniqueViolation":  # a create that did not take the lock: reread
                    return None
                raise
        if inserted:
            return SessionRecord(values["id"], tenant_id, session_id, "creating", provider=provider,
                                 runtime=runtime, owner=owner, lease_expires=values["lease_expires"],
                                 created_at=now, last_used=now)
        if not present:
            err = quota_error(tenant_id, int(held), int(active), tenant_limit, global_limit)
            if err is not None:
                raise err
        return None

    def update(self, tenant_id: str, session_id: str, **fields: Any) -> bool:
        """One UPDATE statement (no read first: this is on the session-create path)."""
        values = {k: (json.dumps(v, sort_keys=True) if k in _JSON_FIELDS else v) for k, v in fields.items()}
        with self._auto.connect() as conn:
            res = conn.execute(update(SessionRow).where(SessionRow.tenant_id == tenant_id,
                                                        SessionRow.session_id == session_id).values(**values))
            return bool(res.rowcount)

    def hand_back(self, tenant_id: str, session_id: str, owner: str, to_owner: str | None,
                  lease_expires: float | None) -> bool:
        """One conditional UPDATE: only while ``owner`` still holds the row."""
        with self._auto.connect() as conn:
            res = conn.execute(update(SessionRow).where(SessionRow.tenant_id == tenant_id,
                                                        SessionRow.session_id == session_id,
                                                        SessionRow.owner == owner)
                               .values(owner=to_owner, lease_expires=lease_expires))
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

    def delete(self, tenant_id: str, session_id: str, *, row_id: str | None = None, owner: str | None = None,
               state: str | None = None) -> bool:
        where = [SessionRow.tenant_id == tenant_id, SessionRow.session_id == session_id]
        if row_id is not None:
            where.append(SessionRow.id == row_id)
        if owner is not None:
            where.append(SessionRow.owner == owner)
        if state is not None:
            where.append(SessionRow.state == state)
        with self._auto.connect() as s:
            return bool(s.execute(delete(SessionRow).where(*where)).rowcount)

    def adoptable(self, owner: str, lease_ttl: float, own_only: bool = False) -> list[SessionRecord]:
        now = time.time()
        mine = SessionRow.owner == owner
        with self._sessions.begin() as s:
            self._lock_rows(s)
            rows = list(s.scalars(select(SessionRow).where(
                SessionRow.state.in_(HELD),
                mine if own_only else or_(mine, SessionRow.owner.is_(None), SessionRow.lease_expires < now),
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

    def orphaned(self, owner: str, now: float, idle_before: float, limit: int) -> list[SessionRecord]:
        """One bounded read per idle sweep instead of the whole table: the same conditions as
        ``SessionRecord.lease_live`` (a row with an owner and no ``lease_expires`` is not live).
        The ``state`` index narrows it to active rows; there is deliberately no index on
        ``lease_expires``: the heartbeat rewrites that column on every owned row every few
        seconds, and indexing it would cost that much more write (no HOT updates on PostgreSQL)
        than it saves this read."""
        q = (select(SessionRow)
             .where(SessionRow.state.in_(ACTIVE),
                    SessionRow.owner.is_not(None), SessionRow.owner != owner,
                    or_(SessionRow.lease_expires.is_(None), SessionRow.lease_expires <= now),
                    SessionRow.last_used <= idle_before)
             .order_by(SessionRow.last_used, SessionRow.tenant_id, SessionRow.session_id)
             .limit(max(0, limit)))
        with self._sessions() as s:
            return [_record(r) for r in s.scalars(q)]

    def expired(self, now: float) -> list[SessionRecord]:
        with self._sessions() as s:
            return [_record(r) for r in s.scalars(select(SessionRow).where(
                SessionRow.expires_at.is_not(None), SessionRow.expires_at < now))]

    def leave(self, owner: str) -> None:
        """Forget ``owner``'s heartbeat row and end its leases now (its rows keep their owner)."""
        now = time.time()
        with self._sessions.begin() as s:
            s.execute(update(SessionRow).where(SessionRow.owner == owner, SessionRow.state.in_(HELD))
                      .values(lease_expires=now))
            s.execute(delete(Replica).where(Replica.id == owner))

    def replicas(self) -> list[dict[str, Any]]:
        with self._sessions() as s:
            return [{"id": r.id, "url": r.url, "started_at": r.started_at, "heartbeat": r.heartbeat}
                    for r in s.scalars(select(Replica).order_by(Replica.id))]
