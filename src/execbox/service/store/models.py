"""SQLAlchemy 2 table definitions: settings, tokens and the audit log.

The Alembic migrations in ``migrations/versions`` are the source of truth for the schema; these
models mirror them for the repositories' queries.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Float, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class SystemSetting(Base):
    """One named setting; provider configs are one JSON row each (``sandbox.<provider>``)."""

    __tablename__ = "system_settings"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    source: Mapped[str] = mapped_column(String(32), nullable=False)
    data_type: Mapped[str] = mapped_column(String(32), nullable=False)
    value: Mapped[str] = mapped_column(Text, nullable=False)
    update_time: Mapped[float] = mapped_column(Float(precision=53), nullable=False, index=True)


class Token(Base):
    """An API token. Only its SHA-256 is stored; last4 lets people tell tokens apart (``prefix`` is
    the fixed ``ebx_`` tag; rows from before review 47 hold 4 more characters, never shown)."""

    __tablename__ = "tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    prefix: Mapped[str] = mapped_column(String(16), nullable=False)
    last4: Mapped[str] = mapped_column(String(4), nullable=False)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False, index=True)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    created_at: Mapped[float] = mapped_column(Float(precision=53), nullable=False)
    revoked_at: Mapped[float | None] = mapped_column(Float(precision=53), nullable=True)


class AuditEntry(Base):
    """One sandbox operation, kept for traceability per tenant."""

    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(128), nullable=False, index=True)
    provider: Mapped[str | None] = mapped_column(String(64), nullable=True)
    operation: Mapped[str] = mapped_column(String(64), nullable=False)
    instance_id: Mapped[str | None] = mapped_column(String(256), nullable=True)
    session_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    token_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    language: Mapped[str | None] = mapped_column(String(32), nullable=True)
    code_hash: Mapped[str | None] = mapped_column(String(80), nullable=True)
    duration_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    status: Mapped[str | None] = mapped_column(String(32), nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    memory_used_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(16), nullable=True)
    created_at: Mapped[float] = mapped_column(Float(precision=53), nullable=False, index=True)
    code: Mapped[str | None] = mapped_column(Text, nullable=True)


class AuditInflight(Base):
    """A run that has started and has no audit row yet (migration 0005): what its row will say,
    so a run the service's own end cut off is recorded as ``interrupted`` at the next start."""

    __tablename__ = "audit_inflight"

    key: Mapped[str] = mapped_column(String(32), primary_key=True)
    replica: Mapped[str] = mapped_column(String(128), nullable=False, index=True)
    started_at: Mapped[float] = mapped_column(Float(precision=53), nullable=False, index=True)
    record: Mapped[str] = mapped_column(Text, nullable=False)


class SessionRow(Base):
    """One session in the registry (migration 0003): where its box is, who owns it, its state."""

    __tablename__ = "sessions"
    __table_args__ = (UniqueConstraint("tenant_id", "session_id", name="uq_sessions_tenant_session"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), nullable=False)
    session_id: Mapped[str] = mapped_column(String(64), nullable=False)
    provider: Mapped[str | None] = mapped_column(String(64), nullable=True)
    box_handle: Mapped[str] = mapped_column(Text, nullable=False, default="{}")
    runtime: Mapped[str | None] = mapped_column(String(32), nullable=True)
    network_policy: Mapped[str] = mapped_column(Text, nullable=False, default="{}")
    state: Mapped[str] = mapped_column(String(16), nullable=False, index=True)
    owner: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    lease_expires: Mapped[float | None] = mapped_column(Float(precision=53), nullable=True)
    contexts_lost: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    created_at: Mapped[float] = mapped_column(Float(precision=53), nullable=False)
    last_used: Mapped[float] = mapped_column(Float(precision=53), nullable=False)
    expires_at: Mapped[float | None] = mapped_column(Float(precision=53), nullable=True)


class Replica(Base):
    """A running `execbox serve` process: its internal URL and last heartbeat."""

    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    url: Mapped[str | None] = mapped_column(Text, nullable=True)
    started_at: Mapped[float] = mapped_column(Float(precision=53), nullable=False)
    heartbeat: Mapped[float] = mapped_column(Float(precision=53), nullable=False)


class E2BSandboxRow(Base):
    """An E2B sandbox of the E2B-compatible endpoint (migration 0006): what E2B adds to its session
    (``e2b-<sandbox_id>``), so sandboxes outlive a restart and every replica knows them."""

    __tablename__ = "e2b_sandboxes"

    sandbox_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), nullable=False, index=True)
    template: Mapped[str] = mapped_column(Text, nullable=False)
    meta: Mapped[str] = mapped_column("metadata", Text, nullable=False, default="{}")
    env_vars: Mapped[str] = mapped_column(Text, nullable=False, default="")
    """JSON, encrypted with the settings' secret key (a sandbox's env vars often hold API keys)."""
    token_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    started_at: Mapped[float] = mapped_column(Float(precision=53), nullable=False)
    end_at: Mapped[float] = mapped_column(Float(precision=53), nullable=False, index=True)
    session_created: Mapped[float | None] = mapped_column(Float(precision=53), nullable=True)
    paused_left: Mapped[float | None] = mapped_column(Float(precision=53), nullable=True)
