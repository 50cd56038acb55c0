"""What resolving a session told the request that asked: did this call create it, and may it.

A session is created on first use (the gateway contract). So that a caller can tell "my session
was just made, empty" from "my session", the manager notes each session it creates while a
request is being served (``note_created``, called where sessions are resolved: manager._load),
and whoever serves the request reads the notes back: the HTTP middleware (a response header,
session_headers.py), the run service (``metadata.session.created``). The same request context
carries the caller's opt-out: ``X-Execbox-Create-Session: false`` makes an unknown session 404
instead of a new one (``creation_allowed``).

The notes travel in a context variable holding a mutable object, so a route's worker thread (which
runs on a copy of the request's context) writes into the object its request's middleware reads.
Nothing is noted outside a ``collecting`` block (reapers, background threads).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

NEVER_CREATES = "this request never creates a session"
"""Why a ``collecting(create=False)`` block refuses to create one, unless it says otherwise."""


@dataclass
class Notes:
    create: bool = True
    """False: a session that does not exist is SB002/404, not created (X-Execbox-Create-Session: false,
    or a route that never creates one)."""
    refusal: str = NEVER_CREATES
    """With ``create=False``: why, in words, for the 404's message ("the request said ...: false")."""
    created: list[dict[str, Any]] = field(default_factory=list)
    """One entry per session created while collecting: tenant_id, session_id and, when this replica
    remembers one, ``previous`` (how the session of that name before it ended)."""


_active: ContextVar[tuple[Notes, ...]] = ContextVar("execbox_session_notes", default=())


@contextmanager
def collecting(create: bool = True, refusal: str = NEVER_CREATES) -> Iterator[Notes]:
    """Collect the notes of the sessions resolved in the block (nested blocks each get them all);
    ``create=False`` forbids creating a session in it, ``refusal`` saying why."""
    notes = Notes(create=create, refusal=refusal)
    token = _active.set((*_active.get(), notes))
    try:
        yield notes
    finally:
        _active.reset(token)


def creation_allowed() -> bool:
    return all(n.create for n in _active.get())


def creation_refusal() -> str:
    """Why creation is not allowed here: the outermost refusing block's reason (the request's own
    header, when it sent one, comes before a route's rule)."""
    return next((n.refusal for n in _active.get() if not n.create), NEVER_CREATES)


def note_created(tenant_id: str, session_id: str, previous: dict[str, Any] | None) -> None:
    entry: dict[str, Any] = {"tenant_id": tenant_id, "session_id": session_id}
    if previous:
        entry["previous"] = previous
    for notes in _active.get():
        notes.created.append(entry)


def created_notice(notes: Notes, tenant_id: str, session_id: str) -> dict[str, Any]:
    """``metadata.session`` keys for a run whose session this request created: ``created: true``,
    and ``recreated`` with ``previous`` when a session of that id existed before and ended."""
    for entry in notes.created:
        if entry["tenant_id"] == tenant_id and entry["session_id"] == session_id:
            out: dict[str, Any] = {"created": True}
            if entry.get("previous"):
                out["recreated"] = True
                out["previous"] = entry["previous"]
            return out
    return {}


def note_forgotten(tenant_id: str, session_id: str) -> None:
    """A session created while collecting whose first box never started is gone again: not created."""
    for notes in _active.get():
        notes.created[:] = [e for e in notes.created
                            if (e["tenant_id"], e["session_id"]) != (tenant_id, session_id)]


_recreate_dead: ContextVar[bool] = ContextVar("execbox_recreate_dead_boxes", default=False)


@contextmanager
def recreating_dead_boxes() -> Iterator[None]:
    """In the block, a session whose box is found dead gets a new box at once, instead of the one
    SB009 that tells an HTTP client its box (and its contexts) died (boxes._ensure_instance). For
    the E2B facade: an E2B sandbox has no state "alive, its box to be made again", so the SDKs
    read that SB009 as a sandbox that is gone (the JS SDK: "not running anymore") and the call
    that met it would have been lost; requests in flight when the box died still get their own."""
    token = _recreate_dead.set(True)
    try:
        yield
    finally:
        _recreate_dead.reset(token)


def dead_box_recreated_quietly() -> bool:
    return _recreate_dead.get()

