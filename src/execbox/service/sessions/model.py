"""What a session is: its in-memory record, the errors about it, and the rules for its runtime.

Split from manager.py so the lifecycle and admin mixins can use the model without importing the
manager that mixes them in.
"""

from __future__ import annotations

import inspect
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...errors import InvalidConfigError, ProviderUnavailableError
from ...providers.base import SandboxProvider
from .. import egress_hook


class ProviderSource(Protocol):
    """What the manager needs from the provider holder (ProviderConfig in production)."""

    def current(self) -> SandboxProvider: ...

    def candidates(self) -> list[SandboxProvider]: ...


class SessionOwnedElsewhere(ProviderUnavailableError):
    """Another live replica owns the session's box: the request is forwarded there (see
    ``service/forwarding.py``), or fails with this SB009 when it cannot be.

    ``forward_to`` (the owner's URL from the registry's ``replicas`` table) is what the error
    handler forwards on; it is an attribute, never read back from ``details``, so an error that
    came over a wire (a remote executor's, a cloud sandbox agent's) can never steer a request.
    """

    retry_after: int = 1
    """Retry-After when not forwarded: until the owner's lease ends (another replica may take over)."""

    def __init__(self, message: str, *, forward_to: str | None = None, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details=details)
        self.forward_to = forward_to


class SessionBusy(Exception):
    """``SessionManager.session(wait=...)``: another request still held the session after ``wait``
    seconds (the caller looks again, e.g. for a run to go beside)."""


@dataclass(eq=False)
class Session:
    tenant_id: str
    session_id: str
    workspace: str | None
    provider: SandboxProvider | None = None
    instance_id: str | None = None
    created_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    busy: int = 0
    running: int = 0
    """Runs of code in progress (RunService); file operations may go beside them (``beside_run``)."""
    operations: int = 0
    boxes_started: int = 0
    closed: bool = False
    state: str = "creating"
    contexts_lost: bool = False
    """The session's in-memory contexts (Python globals) were lost by a restart or pause and not
    yet reported to the caller; its files are intact."""
    expires_at: float | None = None
    last_used_wall: float = field(default_factory=time.time)
    network: dict[str, Any] | None = None
    """The session's narrowed egress policy (issue 14; the registry keeps it as network_policy)."""
    pending_handle: Any = None
    """A registry row whose running box could not be re-attached yet (provider still starting)."""
    cancel_reason: str | None = None
    """Why the service itself cancelled what the session runs ("fenced", "draining", "destroyed"):
    a run it cut off says so in ``metadata.cancelled_reason``."""
    runtime: str | None = None
    """The runtime template the session started with (issue 14; None: the provider's default);
    the registry keeps it, so a box restarted after a service restart starts the same one."""

    def to_dict(self, owner: str | None = None) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id, "session_id": self.session_id, "state": self.state, "owner": owner,
            "provider": self.provider.name if self.provider else None, "instance_id": self.instance_id,
            "created_at": self.created_at, "idle_seconds": round(time.monotonic() - self.last_used, 3),
            "last_used": self.last_used_wall, "expires_at": self.expires_at, "contexts_lost": self.contexts_lost,
            "busy": self.busy > 0, "operations": self.operations, "boxes_started": self.boxes_started,
            "runtime": self.runtime,
            **egress_hook.describe(self),  # issue 14: the effective network policy
        }


def box_ref(handle: dict[str, Any]) -> str:
    """What identifies a session's running box in its registry handle ("" when none): ``box_id``
    (a Kubernetes pod), or ``container_id`` (a Docker container: the key its provider and every
    stored Docker row use, kept as it is)."""
    return str(handle.get("box_id") or handle.get("container_id") or "")


def accepts(provider: SandboxProvider, name: str) -> bool:
    try:
        return name in inspect.signature(provider.create_instance).parameters
    except (TypeError, ValueError):
        return False


def pick_runtime(s: Session, runtime: str | None) -> None:
    """The request that starts a session picks its runtime template; another one later is 409."""
    if runtime and runtime != s.runtime and (s.instance_id or s.boxes_started or s.pending_handle):
        raise InvalidConfigError(f"session {s.tenant_id}/{s.session_id} runs runtime {s.runtime or 'default'!r}; "
                                 f"a runtime is chosen when a session starts (asked: {runtime!r})",
                                 details={"field": "runtime", "value": runtime}, http_status=409)
    s.runtime = runtime or s.runtime
