"""Every ``EXECBOX_*`` / ``SANDBOX_*`` environment variable execbox reads, so that ``execbox serve``
can warn about one it does not (a misspelled database URL variable would otherwise start the
service on a local SQLite file without a word).

The list is kept honest by tests/unit/test_env_names.py: every such name written anywhere under
src/ must be in :data:`KNOWN` (or be a Python constant: :data:`NOT_ENVIRONMENT`), and every one
the docs mention must be known, in :data:`SCRIPT_ONLY`, or a contract name execbox does not read
(:data:`REPLACED`, which the docs say so of). Besides these, ``EXECBOX_<PROVIDER>_<FIELD>`` sets
any field of a provider's schema on first boot (service/store/sandbox_seed.py):
:func:`provider_field_names`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

KNOWN: frozenset[str] = frozenset({
    # the settings store, keys and replicas
    "EXECBOX_DATA_DIR", "EXECBOX_DATABASE_URL", "EXECBOX_SEED_FILE", "EXECBOX_SECRET_KEY",
    "EXECBOX_SECRET_KEY_PREVIOUS", "EXECBOX_NEW_SECRET_KEY", "EXECBOX_CONFIG_CHECK_INTERVAL",
    "EXECBOX_REPLICA_ID", "EXECBOX_REPLICA_URL", "EXECBOX_INTERNAL_SECRET", "EXECBOX_SESSION_LEASE",
    "EXECBOX_PAUSED_RETENTION", "EXECBOX_DRAIN_TIMEOUT", "EXECBOX_WORKSPACES_DIR", "EXECBOX_AUDIT_DAYS",
    # the service's limits (service/config.py)
    "SANDBOX_TYPE", "SANDBOX_BACKEND", "SANDBOX_TIMEOUT_SEC", "SANDBOX_IDLE_TIMEOUT", "SANDBOX_IDLE_ACTION",
    "SANDBOX_MAX_SESSIONS", "SANDBOX_TENANT_MAX_SESSIONS", "SANDBOX_TENANT_MAX_EXECUTIONS",
    "SANDBOX_TENANT_MAX_REQUESTS", "SANDBOX_MAX_CODE_BYTES", "SANDBOX_MAX_FILE_BYTES",
    "SANDBOX_MAX_REQUEST_BYTES", "SANDBOX_MAX_BACKGROUND_PROCESSES", "SANDBOX_TENANT_MAX_BACKGROUND_PROCESSES",
    "SANDBOX_BACKGROUND_HOLD_BYTES", "SANDBOX_TENANT_BACKGROUND_HOLD_BYTES",
    "SANDBOX_TENANT_BACKGROUND_FLOOR_BYTES", "SANDBOX_BACKGROUND_ENDED_TAIL_BYTES", "SANDBOX_AUDIT_CODE",
    "SANDBOX_GPU_ENABLED", "SANDBOX_GPU_NETWORK_ENABLED", "SANDBOX_EXECUTOR_ENDPOINT",
    # boxes, runtimes and installs
    "EXECBOX_JAIL_DIR", "EXECBOX_JAIL_HOST_UID", "EXECBOX_JAIL_UID_RANGE", "EXECBOX_IMAGE_CACHE",
    "EXECBOX_GPU_DEV_ROOT", "EXECBOX_BUILD_TIMEOUT", "EXECBOX_INSTALL_TIMEOUT", "EXECBOX_INSTALL_MAX_BYTES",
    "EXECBOX_PIP_INDEX_URL", "EXECBOX_NPM_REGISTRY", "EXECBOX_K8S_AGENT_SECRET", "EXECBOX_E2B_DOMAIN",
    # egress
    "EXECBOX_EGRESS_AUDIT_DAYS", "EXECBOX_EGRESS_INTERCEPT_IDLE", "EXECBOX_EGRESS_KERNEL_ROUTE",
    "EXECBOX_EGRESS_MAX_BYTES", "EXECBOX_EGRESS_MAX_CONNECTIONS", "EXECBOX_EGRESS_RESOLVER",
    "EXECBOX_EGRESS_UPSTREAM_CA",
    # the executor, MCP and client commands
    "EXECBOX_EXECUTOR_TOKEN", "EXECBOX_EXECUTOR_ALLOWED_HOSTS", "EXECBOX_EXECUTOR_MAX_ARTIFACT_BYTES",
    "EXECBOX_MCP_MAX_OUTPUT", "EXECBOX_MCP_MAX_REQUEST_BYTES", "EXECBOX_MCP_MAX_RESOURCE_BYTES",
    "EXECBOX_MCP_MAX_SESSIONS", "EXECBOX_MCP_MAX_TIMEOUT", "EXECBOX_MCP_UNUSED_SESSION_TIMEOUT",
    "EXECBOX_URL", "EXECBOX_TOKEN", "EXECBOX_API_DOCS",
    # set inside boxes by execbox itself (the agent reads them)
    "EXECBOX_AGENT_TOKEN", "EXECBOX_ARGUMENTS_FILE", "EXECBOX_MPL_SEED",
})
"""The names execbox reads (or sets in a box for its own agent)."""

SCRIPT_ONLY: frozenset[str] = frozenset({
    "EXECBOX_VERIFY_PYTHON", "EXECBOX_VERIFY_NO_INSTALL", "EXECBOX_GPU_RUNTIME",
    "EXECBOX_K8S_IMAGE", "EXECBOX_K8S_NAMESPACE", "EXECBOX_K8S_RUNTIME_CLASS",
})
"""Read by the scripts under scripts/ and the test suite, which the docs describe: never warned
about (they are often exported in the shell a service is started from)."""

NOT_ENVIRONMENT: frozenset[str] = frozenset({"SANDBOX_UID"})
"""Names written under src/ that are Python constants, not environment variables (``SANDBOX_UID``:
the fixed uid of a docker/kubernetes box's user, boxes/images.py). Not in :data:`KNOWN`: setting one
does nothing, so ``serve`` warns about it."""

REPLACED: dict[str, str] = {
    "SANDBOX_WORKER_IMAGE": "the docker provider's `image` (EXECBOX_DOCKER_IMAGE on first boot, "
                            "else `execbox config set docker image=...`)",
    "SANDBOX_MEM_LIMIT": "the docker provider's `max_memory` (EXECBOX_DOCKER_MAX_MEMORY on first boot, "
                         "else `execbox config set docker max_memory=...`)",
}
"""Names of the gateway design contract execbox does not read, and what does their job: the warning
for one names it."""

_NAME = re.compile(r"^(?:EXECBOX|SANDBOX)_[A-Z0-9_]+$")


def provider_field_names() -> set[str]:
    """``EXECBOX_<PROVIDER>_<FIELD>`` for every installed provider's schema field."""
    from .providers import registry
    from .service.store.sandbox_seed import schema_or_none

    return {f"EXECBOX_{provider}_{field}".upper()
            for provider in registry.provider_names() for field in (schema_or_none(provider) or {})}


def unknown_names(env: Mapping[str, str], known: Iterable[str] | None = None) -> dict[str, str | None]:
    """``{name: closest known name or None}`` for each ``EXECBOX_*``/``SANDBOX_*`` name in ``env``
    that execbox does not read."""
    every = set(KNOWN | SCRIPT_ONLY) | set(provider_field_names() if known is None else known)
    out: dict[str, str | None] = {}
    for name in sorted(env):
        if _NAME.match(name) and name not in every:
            close = difflib.get_close_matches(name, sorted(every), n=1, cutoff=0.8)
            out[name] = close[0] if close else None
    return out


def unknown_name_warnings(env: Mapping[str, str]) -> list[str]:
    """One line per unknown name, for ``execbox serve`` to print at start."""
    return [f"warning: {name} is not an environment variable execbox reads; it is ignored"
            + (f"; use {REPLACED[name]}" if name in REPLACED else f" (did you mean {close}?)" if close else "")
            for name, close in unknown_names(env).items()]


__all__ = ["KNOWN", "NOT_ENVIRONMENT", "REPLACED", "SCRIPT_ONLY", "provider_field_names", "unknown_name_warnings",
           "unknown_names"]
