"""Service settings read from the environment, parsed strictly (a bad value is SB002 naming the variable).

The names follow the gateway contract (SANDBOX_IDLE_TIMEOUT, SANDBOX_MAX_SESSIONS) plus execbox's
own quota and size limits. Tests build ``ServiceSettings(...)`` directly with small values.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from urllib.parse import urlsplit

from ..settings import parse_bool, parse_days, parse_duration, parse_int, sandbox_timeout


def replica_base_url(url: str) -> bool:
    """Is ``url`` a plain ``http(s)://host[:port]`` base a request path can be appended to (no
    user info, path, query or fragment that would change where a forwarded request goes)?"""
    try:
        u = urlsplit(url)
        u.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return False
    return (u.scheme in ("http", "https") and bool(u.hostname) and "@" not in u.netloc
            and u.path in ("", "/") and not u.query and not u.fragment and "?" not in url and "#" not in url)


def internal_secret() -> str:
    """EXECBOX_INTERNAL_SECRET: signs requests one replica forwards to another (empty: none)."""
    return os.environ.get("EXECBOX_INTERNAL_SECRET", "")


def forwarding_enabled() -> bool:
    """The secret is set: requests for sessions another replica owns are replayed there
    (service/forwarding.py), and the owner counts and audits them, so this replica does not."""
    return bool(internal_secret())


@dataclass(frozen=True)
class ServiceSettings:
    idle_timeout: float = 900.0
    """SANDBOX_IDLE_TIMEOUT: seconds a session may stay unused before its box is reaped."""
    max_sessions: int = 50
    """SANDBOX_MAX_SESSIONS: sessions across all tenants (SB004/503 beyond)."""
    tenant_max_sessions: int = 20
    """SANDBOX_TENANT_MAX_SESSIONS: sessions one tenant may hold (SB008/429 beyond)."""
    tenant_max_executions: int = 10
    """SANDBOX_TENANT_MAX_EXECUTIONS: concurrent executions per tenant (SB008/429 beyond)."""
    tenant_max_requests: int = 40
    """SANDBOX_TENANT_MAX_REQUESTS: session requests per tenant in flight, queued ones included
    (each holds a worker thread; SB008/429 beyond)."""
    default_timeout: float = 30.0
    """SANDBOX_TIMEOUT_SEC: timeout of an execution that names none."""
    max_code_bytes: int = 1024 * 1024
    """SANDBOX_MAX_CODE_BYTES: largest code/command accepted (413 beyond)."""
    max_file_bytes: int = 16 * 1024 * 1024
    """SANDBOX_MAX_FILE_BYTES: largest single file in write/copy (413 beyond)."""
    max_request_bytes: int = 64 * 1024 * 1024
    """SANDBOX_MAX_REQUEST_BYTES: largest request body (413 beyond, checked before parsing)."""
    max_background_processes: int = 32
    """SANDBOX_MAX_BACKGROUND_PROCESSES: background processes running at once in one session (HTTP
    ``.../processes``, MCP ``start_process``) and, counted apart, those started through the E2B
    endpoint (commands.run, foreground or background, pty.create) in one sandbox (SB008/429 beyond)."""
    tenant_max_background_processes: int = 64
    """SANDBOX_TENANT_MAX_BACKGROUND_PROCESSES: background processes one tenant runs at once, across
    its sessions and sandboxes (HTTP API, MCP and E2B; SB008/429 beyond)."""
    background_hold_bytes: int = 256 * 1024 * 1024
    """SANDBOX_BACKGROUND_HOLD_BYTES: output of background processes the service holds in memory,
    all tenants together; past it output waits in the boxes until clients read."""
    tenant_background_hold_bytes: int = 64 * 1024 * 1024
    """SANDBOX_TENANT_BACKGROUND_HOLD_BYTES: the same, for one tenant."""
    tenant_background_floor_bytes: int | None = None
    """SANDBOX_TENANT_BACKGROUND_FLOOR_BYTES: what a tenant running a background process may always
    hold, even while the others fill SANDBOX_BACKGROUND_HOLD_BYTES (floors come on top of it:
    follower.Budget); at most the tenant's budget. None: a sixteenth of it (4 MiB by default)."""
    background_ended_tail_bytes: int = 64 * 1024
    """SANDBOX_BACKGROUND_ENDED_TAIL_BYTES: unread output kept per stream of a process that ended
    (after a grace of a minute for readers still at it); the rest is dropped, and said so in reads."""
    audit_code: bool = False
    """SANDBOX_AUDIT_CODE: store the code itself in the audit table (off: only its sha256)."""
    api_docs: bool = False
    """EXECBOX_API_DOCS: serve /docs (Swagger UI) and /redoc, which load scripts from a CDN
    (service/api_docs.py); off: only /openapi.json."""
    reap_interval: float = 0.0
    """Seconds between idle sweeps; 0 derives it from idle_timeout."""
    data_dir: str = ""
    """The store's data directory (empty: the store's own)."""
    replica_id: str = ""
    """EXECBOX_REPLICA_ID: this replica's name in the session registry (empty: the host name).
    Stable across restarts, so a restarted replica re-adopts its sessions; unique per replica."""
    replica_url: str = ""
    """EXECBOX_REPLICA_URL: the URL other replicas use to reach this one (shown in the registry)."""
    lease_ttl: float = 15.0
    """EXECBOX_SESSION_LEASE: seconds a replica's ownership lasts without a heartbeat."""
    paused_retention: float = 86400.0
    """EXECBOX_PAUSED_RETENTION: seconds a paused session is kept before it is deleted."""
    idle_action: str = "destroy"
    """SANDBOX_IDLE_ACTION: what happens to an idle session: destroy (default) or pause."""
    drain_timeout: float = 30.0
    """EXECBOX_DRAIN_TIMEOUT: seconds in-flight requests may finish after SIGTERM."""
    audit_days: float = 365.0
    """EXECBOX_AUDIT_DAYS: days run audit rows are kept (0: all); read again by the audit writer."""
    egress_audit_days: float = 30.0
    """EXECBOX_EGRESS_AUDIT_DAYS: days egress audit rows are kept (0: all); read again by its writer."""
    workspaces_dir: str = ""
    """EXECBOX_WORKSPACES_DIR: session workspaces persist here as <registry id>/<tenant>/<session>.
    Empty: /var/lib/execbox/workspaces as root (boxes run as an unprivileged uid that must be able
    to traverse it, and the data dir is 0700), else <data_dir>/workspaces."""

    def resolve_workspaces_dir(self, data_dir: str) -> str:
        if self.workspaces_dir:
            return self.workspaces_dir
        if os.geteuid() == 0:
            return "/var/lib/execbox/workspaces"
        return os.path.join(data_dir, "workspaces")

    @property
    def sweep_every(self) -> float:
        if self.reap_interval > 0:
            return self.reap_interval
        return max(0.05, min(30.0, self.idle_timeout / 4))

    def with_(self, **changes: object) -> ServiceSettings:
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> ServiceSettings:
        """Read every SANDBOX_* knob; unset means the default, unparseable means SB002."""
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            raw = env.get(name)
            return raw if raw is not None and raw.strip() != "" else None

        values: dict[str, object] = {"default_timeout": sandbox_timeout(env)}
        durations = {"SANDBOX_IDLE_TIMEOUT": "idle_timeout", "EXECBOX_SESSION_LEASE": "lease_ttl",
                     "EXECBOX_PAUSED_RETENTION": "paused_retention", "EXECBOX_DRAIN_TIMEOUT": "drain_timeout"}
        ints = {
            "SANDBOX_MAX_SESSIONS": ("max_sessions", 1),
            "SANDBOX_TENANT_MAX_SESSIONS": ("tenant_max_sessions", 1),
            "SANDBOX_TENANT_MAX_EXECUTIONS": ("tenant_max_executions", 1),
            "SANDBOX_TENANT_MAX_REQUESTS": ("tenant_max_requests", 1),
            "SANDBOX_MAX_CODE_BYTES": ("max_code_bytes", 1),
            "SANDBOX_MAX_FILE_BYTES": ("max_file_bytes", 1),
            "SANDBOX_MAX_REQUEST_BYTES": ("max_request_bytes", 1024),
            "SANDBOX_MAX_BACKGROUND_PROCESSES": ("max_background_processes", 1),
            "SANDBOX_TENANT_MAX_BACKGROUND_PROCESSES": ("tenant_max_background_processes", 1),
            "SANDBOX_BACKGROUND_HOLD_BYTES": ("background_hold_bytes", 65536),
            "SANDBOX_TENANT_BACKGROUND_HOLD_BYTES": ("tenant_background_hold_bytes", 65536),
            "SANDBOX_TENANT_BACKGROUND_FLOOR_BYTES": ("tenant_background_floor_bytes", 0),
            "SANDBOX_BACKGROUND_ENDED_TAIL_BYTES": ("background_ended_tail_bytes", 0),
        }
        for var, attr in durations.items():
            if (raw := get(var)) is not None:
                values[attr] = parse_duration(raw, var)
        for var, (attr, minimum) in ints.items():
            if (raw := get(var)) is not None:
                values[attr] = parse_int(raw, var, minimum)
        if (raw := get("EXECBOX_WORKSPACES_DIR")) is not None:
            values["workspaces_dir"] = raw.strip()
        for var, attr in (("EXECBOX_REPLICA_ID", "replica_id"), ("EXECBOX_REPLICA_URL", "replica_url")):
            if (raw := get(var)) is not None:
                values[attr] = raw.strip()
        if values.get("replica_url") and not replica_base_url(str(values["replica_url"])):
            from ..errors import InvalidConfigError

            raise InvalidConfigError("EXECBOX_REPLICA_URL must be a plain http(s)://host[:port] URL (no path, query "
                                     "or user info): other replicas append request paths to it",
                                     details={"field": "EXECBOX_REPLICA_URL"})
        if (raw := get("SANDBOX_IDLE_ACTION")) is not None:
            if raw.strip() not in ("destroy", "pause"):
                from ..errors import InvalidConfigError

                raise InvalidConfigError("SANDBOX_IDLE_ACTION must be destroy or pause",
                                         details={"field": "SANDBOX_IDLE_ACTION", "value": raw})
            values["idle_action"] = raw.strip()
        for var, attr in (("EXECBOX_AUDIT_DAYS", "audit_days"), ("EXECBOX_EGRESS_AUDIT_DAYS", "egress_audit_days")):
            if (raw := get(var)) is not None:  # the writers read them again (store/retention.py)
                values[attr] = parse_days(raw, var)
        if (raw := get("SANDBOX_AUDIT_CODE")) is not None:
            values["audit_code"] = parse_bool(raw, "SANDBOX_AUDIT_CODE")
        if (raw := get("EXECBOX_API_DOCS")) is not None:
            values["api_docs"] = parse_bool(raw, "EXECBOX_API_DOCS")
        known = {f.name for f in fields(cls)}
        values.update({k: v for k, v in overrides.items() if k in known and v is not None})
        floor = values.get("tenant_background_floor_bytes")
        tenant_hold = values.get("tenant_background_hold_bytes", cls.tenant_background_hold_bytes)
        if isinstance(floor, int) and isinstance(tenant_hold, int) and floor > tenant_hold:
            from ..errors import InvalidConfigError

            raise InvalidConfigError(f"SANDBOX_TENANT_BACKGROUND_FLOOR_BYTES: must be <= "
                                     f"SANDBOX_TENANT_BACKGROUND_HOLD_BYTES ({tenant_hold}): the floor is "
                                     "the part of a tenant's budget it may always hold",
                                     details={"field": "SANDBOX_TENANT_BACKGROUND_FLOOR_BYTES", "value": floor,
                                              "limit": tenant_hold})
        return cls(**values)  # type: ignore[arg-type]
