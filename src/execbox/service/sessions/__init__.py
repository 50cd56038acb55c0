"""Session management: the manager, its registry contract and the workspace helpers.

``manager`` (find/create/use a session), ``model`` (the Session record), ``admin`` (list, info, destroy), ``lifecycle``
(restart, drain, pause/resume, expiry, heartbeat), ``registry`` (the record, the contract, the
in-memory registry; the SQL one is in ``store/sessions_repo.py``), ``limits`` (per-tenant
counters, the session-quota answer), ``notes`` (what resolving a session tells the request),
``ended`` (sessions ended lately), ``workspace`` (names, dirs).
"""

from __future__ import annotations

from .manager import SessionManager
from .model import ProviderSource, Session, SessionBusy, SessionOwnedElsewhere
from .registry import MemoryRegistry, SessionRecord, SessionRegistry
from .workspace import MOUNT_WAIT_SECONDS, NAME_PATTERN, check_name, remove_workspace

__all__ = ["MOUNT_WAIT_SECONDS", "NAME_PATTERN", "MemoryRegistry", "ProviderSource", "Session",
           "SessionBusy", "SessionManager", "SessionOwnedElsewhere", "SessionRecord", "SessionRegistry", "check_name",
           "remove_workspace"]
