"""Repositories over the store's tables: settings, tokens, audit. Short transactions, no ORM
objects leak out (callers get plain values or frozen records)."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from ...errors import InvalidConfigError
from .models import AuditEntry, SystemSetting, Token
from .retention import delete_older
from .safe_text import control_character, storable_fields

TOKEN_PREFIX = "ebx_"
ROLES = ("tenant", "admin")


@dataclass(frozen=True)
class SettingRecord:
    name: str
    source: str
    data_type: str
    value: str
    update_time: float


_VERSION_QUERY = select(func.max(SystemSetting.update_time))


class SettingsRepo:
    """``system_settings``: one row per name; every write bumps the store's version."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions
        self._engine = sessions.kw["bind"]

    def get(self, name: str) -> str | None:
        with self._sessions() as s:
            return s.scalar(select(SystemSetting.value).where(SystemSetting.name == name))

    def get_record(self, name: str) -> SettingRecord | None:
        with self._sessions() as s:
            row = s.get(SystemSetting, name)
            return _setting(row) if row else None

    def all(self) -> dict[str, SettingRecord]:
        with self._sessions() as s:
            rows = s.scalars(select(SystemSetting).where(_NOT_INTERNAL).order_by(SystemSetting.name))
            return {r.name: _setting(r) for r in rows}

    def set(self, name: str, value: str, source: str = "admin", data_type: str = "json") -> float:
        """Insert or replace one row atomically; returns its new update_time."""
        return self.set_many({name: value}, source=source, data_type=data_type)

    def set_many(self, values: dict[str, str], source: str = "admin", data_type: str = "json",
                 data_types: dict[str, str] | None = None) -> float:
        """Write several rows in one transaction (all or none)."""
        with self._sessions.begin() as s:
            return self._write(s, values, source, data_type, data_types or {})

    def update(self, name: str, fn: Callable[[str | None], str], source: str = "admin",
               data_type: str = "json") -> str:
        """Read-modify-write one row under a row lock (SELECT ... FOR UPDATE where supported;
        SQLite serialises writers with BEGIN IMMEDIATE). Returns the value written."""
        with self._sessions.begin() as s:
            _lock_for_write(s)
            current = s.scalar(select(SystemSetting.value).where(SystemSetting.name == name)
                               .with_for_update())
            new = fn(current)
            self._write(s, {name: new}, source, data_type, {})
            return new

    def seed(self, values: dict[str, str], source: str = "seed", data_type: str = "json",
             data_types: dict[str, str] | None = None, marker: str | None = None) -> bool:
        """First-boot write: under the write lock, write ``values`` only if ``marker`` (default:
        the first name) does not exist yet. Two processes booting at once seed exactly once."""
        marker = marker or next(iter(values))
        with self._sessions.begin() as s:
            _lock_for_write(s)
            if s.get(SystemSetting, marker) is not None:
                return False
            self._write(s, values, source, data_type, data_types or {})
            return True

    def rewrite(self, fn: Callable[[dict[str, str]], dict[str, str]], source: str = "admin") -> int:
        """Under the write lock: give ``fn`` every {name: value}; write back the rows it returns
        (same data types), all in one transaction. Returns how many rows changed."""
        with self._sessions.begin() as s:
            _lock_for_write(s)
            rows = {r.name: r for r in s.scalars(select(SystemSetting).where(_NOT_INTERNAL))}
            changed = fn({n: r.value for n, r in rows.items()})
            if changed:
                self._write(s, changed, source, "json", {n: rows[n].data_type for n in changed if n in rows})
            return len(changed)

    def version(self) -> float:
        """max(update_time): one cheap indexed query, for hot reload (Core, no ORM session)."""
        try:
            with self._engine.connect() as conn:
                return float(conn.execute(_VERSION_QUERY).scalar() or 0.0)
        except DBAPIError as e:
            if not e.connection_invalidated:
                raise
            with self._engine.connect() as conn:  # the pool dropped a dead connection: once more
                return float(conn.execute(_VERSION_QUERY).scalar() or 0.0)

    @staticmethod
    def _write(s: Session, values: dict[str, str], source: str, data_type: str,
               data_types: dict[str, str]) -> float:
        _lock_for_write(s)
        # Strictly increasing versions even when two writes land in the same clock tick or the
        # writers' clocks disagree: a reader must never miss a change.
        latest = s.scalar(select(func.max(SystemSetting.update_time))) or 0.0
        stamp = max(time.time(), float(latest) + 1e-3)
        for name, value in values.items():
            if not isinstance(value, str):
                raise InvalidConfigError(f"setting {name!r}: value must be a string",
                                         details={"field": name})
            dt = data_types.get(name, data_type)
            row = s.get(SystemSetting, name, with_for_update=True)
            if row is None:
                s.add(SystemSetting(name=name, source=source, data_type=dt, value=value, update_time=stamp))
            else:
                row.value, row.source, row.data_type, row.update_time = value, source, dt, stamp
        s.flush()
        return stamp


INTERNAL_PREFIX = "_store."
"""Rows the store keeps for itself (the write lock, the registry id): never listed as settings."""
LOCK_ROW = "_store.write_lock"
REGISTRY_ID_ROW = "_store.registry_id"
_NOT_INTERNAL = ~SystemSetting.name.startswith(INTERNAL_PREFIX, autoescape=True)


def _lock_for_write(s: Session) -> None:
    """Serialise writers on every database: updating the sentinel row takes a row lock held
    until commit (PostgreSQL/MySQL) or SQLite's database write lock. Must be the transaction's
    first statement so SQLite never has to upgrade a read snapshot."""
    if s.info.get("write_locked"):
        return
    s.execute(update(SystemSetting).where(SystemSetting.name == LOCK_ROW).values(source="lock"))
    s.info["write_locked"] = True


def _setting(row: SystemSetting) -> SettingRecord:
    return SettingRecord(row.name, row.source, row.data_type, row.value, float(row.update_time))


@dataclass(frozen=True)
class TokenRecord:
    id: str
    tenant_id: str
    role: str
    name: str | None
    prefix: str
    last4: str
    created_at: float
    revoked_at: float | None

    @property
    def display(self) -> str:
        """How a token is shown anywhere: the fixed ``ebx_`` tag and the last 4 characters, no
        more of the secret (rows made before review 47 store 4 random characters in ``prefix``:
        never shown)."""
        return f"{TOKEN_PREFIX}...{self.last4}"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "tenant_id": self.tenant_id, "role": self.role, "name": self.name,
                "token": self.display, "created_at": self.created_at, "revoked": self.revoked_at is not None}


def hash_token(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


class TokensRepo:
    """API tokens: 256-bit random, stored as SHA-256 (a fast hash is right for high-entropy
    secrets), shown once at creation."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def create(self, tenant_id: str, role: str = "tenant",
               name: str | None = None) -> tuple[TokenRecord, str]:
        if role not in ROLES:
            raise InvalidConfigError(f"role must be one of {', '.join(ROLES)}",
                                     details={"fields": {"role": "invalid"}})
        from ..sessions.workspace import check_name  # the service's one rule for tenant ids (lazy: light store)

        try:
            check_name(tenant_id, "tenant_id")  # a tenant every sandbox request would refuse: SB002 now
        except InvalidConfigError as e:
            raise InvalidConfigError(e.message, details={"fields": {"tenant_id": "invalid"}}) from None
        bad = control_character(name) if name is not None else None
        if bad is not None or (name is not None and len(name) > 128):
            raise InvalidConfigError(f"name must be at most 128 characters without control characters"
                                     f"{f' (found {bad})' if bad else ''}", details={"fields": {"name": "invalid"}})
        plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
        row = Token(id="tok_" + secrets.token_hex(8), token_hash=hash_token(plaintext),
                    prefix=TOKEN_PREFIX, last4=plaintext[-4:], tenant_id=tenant_id, role=role,
                    name=name, created_at=time.time(), revoked_at=None)
        with self._sessions.begin() as s:
            s.add(row)
            s.flush()
            rec = _token(row)
        return rec, plaintext

    def verify(self, plaintext: str) -> TokenRecord | None:
        """The live token ``plaintext`` names, or None. Every API request asks, against the database
        each time (a revocation holds at once, on every replica): so a plain Core select on a
        connection, ~5x less CPU than an ORM session and entity load (docs/benchmarks.md)."""
        if not plaintext or not plaintext.startswith(TOKEN_PREFIX) or len(plaintext) > 256:
            return None
        engine = self._sessions.kw["bind"]
        with engine.connect() as conn:
            row = conn.execute(_VERIFY, {"token_hash": hash_token(plaintext)}).first()
        if row is None or row.revoked_at is not None:
            return None
        return _token(row)

    def get(self, token_id: str) -> TokenRecord | None:
        with self._sessions() as s:
            row = s.get(Token, token_id)
            return _token(row) if row else None

    def list(self, include_revoked: bool = False) -> list[TokenRecord]:
        q = select(Token).order_by(Token.created_at)
        if not include_revoked:
            q = q.where(Token.revoked_at.is_(None))
        with self._sessions() as s:
            return [_token(r) for r in s.scalars(q)]

    def revoke(self, token_id: str) -> bool:
        with self._sessions.begin() as s:
            res = s.execute(update(Token).where(Token.id == token_id, Token.revoked_at.is_(None))
                            .values(revoked_at=time.time()))
            return bool(res.rowcount)

    def count(self, role: str | None = None) -> int:
        q = select(func.count()).select_from(Token).where(Token.revoked_at.is_(None))
        if role:
            q = q.where(Token.role == role)
        with self._sessions() as s:
            return int(s.scalar(q) or 0)


_VERIFY = select(Token.__table__).where(Token.__table__.c.token_hash == bindparam("token_hash"))


def _token(row: Any) -> TokenRecord:
    """From a ``Token`` entity or a Core row of its table (same attribute names)."""
    return TokenRecord(row.id, row.tenant_id, row.role, row.name, row.prefix, row.last4,
                       float(row.created_at), row.revoked_at)


AUDIT_FIELDS = ("tenant_id", "provider", "operation", "instance_id", "session_id", "token_id", "language",
                "code_hash", "duration_ms", "status", "exit_code", "memory_used_mb", "error_code", "code",
                "created_at")


def audit_row(fields: dict[str, Any]) -> dict[str, Any]:
    """The row to insert for one audit record (every column named), whatever a tenant put in
    it: NUL and lone surrogates escaped (safe_text; PostgreSQL refuses NUL), over-long values
    clipped to their column (marked), defaults filled in. Used by ``record`` and by the audit
    writer's batches alike, so no path inserts a row this has not seen."""
    unknown = set(fields) - set(AUDIT_FIELDS)
    if unknown:
        raise InvalidConfigError(f"unknown audit fields: {', '.join(sorted(unknown))}")
    fields = dict(fields)
    if fields.get("code") is not None and not fields.get("code_hash"):  # of the code as submitted
        fields["code_hash"] = "sha256:" + hashlib.sha256(
            str(fields["code"]).encode("utf-8", "surrogatepass")).hexdigest()
    fields = storable_fields(fields)
    # An over-long identifier must not cost the whole record: clip to the column (marked).
    for name, value in fields.items():
        length = getattr(AuditEntry.__table__.c[name].type, "length", None)
        if length and isinstance(value, str) and len(value) > length:
            fields[name] = value[:length - 1] + "…"
    if fields.get("created_at") is None:
        fields["created_at"] = time.time()
    if not fields.get("tenant_id"):
        fields["tenant_id"] = "default"
    if not fields.get("operation"):
        fields["operation"] = "execute"
    return {name: fields.get(name) for name in AUDIT_FIELDS}


class AuditRepo:
    """Append-only log of sandbox operations."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def record(self, **fields: Any) -> None:
        row = audit_row(fields)
        with self._sessions.begin() as s:
            s.execute(insert(AuditEntry).values(**row))

    def prune(self, older_than: float) -> int:
        """Delete rows written before ``older_than`` (epoch seconds); returns how many."""
        return delete_older(self._sessions, AuditEntry, AuditEntry.created_at, older_than)

    def list(self, limit: int = 100, tenant_id: str | None = None, *, before_id: int | None = None,
             since: float | None = None, until: float | None = None,
             include_code: bool = True) -> list[dict[str, Any]]:
        """Newest first. ``before_id`` pages back (ids below it), ``since``/``until`` bound
        created_at (``since`` <= t < ``until``). Without ``include_code`` the code column is not
        even read (a row's code may be 1 MiB) and each row says ``has_code`` instead."""
        table = AuditEntry.__table__
        fields = AUDIT_FIELDS if include_code else tuple(f for f in AUDIT_FIELDS if f != "code")
        cols = [table.c.id, *(table.c[f] for f in fields)]
        if not include_code:
            cols.append(table.c.code.is_not(None).label("has_code"))
        q = select(*cols).order_by(table.c.id.desc()).limit(max(1, min(limit, 10000)))
        if tenant_id is not None:
            q = q.where(table.c.tenant_id == tenant_id)
        if before_id is not None:
            q = q.where(table.c.id < before_id)
        if since is not None:
            q = q.where(table.c.created_at >= since)
        if until is not None:
            q = q.where(table.c.created_at < until)
        with self._sessions() as s:
            return [_audit_row(r._mapping) for r in s.execute(q)]

    def get(self, entry_id: int) -> dict[str, Any] | None:
        """One entry, its code included (None when SANDBOX_AUDIT_CODE was off for it)."""
        with self._sessions() as s:
            row = s.get(AuditEntry, entry_id)
            return None if row is None else {"id": row.id, **{f: getattr(row, f) for f in AUDIT_FIELDS}}


def _audit_row(row: Any) -> dict[str, Any]:
    out = dict(row)
    if "has_code" in out:
        out["has_code"] = bool(out["has_code"])
    return out


__all__ = ["AuditRepo", "audit_row", "SettingRecord", "SettingsRepo", "TokenRecord", "TokensRepo", "hash_token"]
