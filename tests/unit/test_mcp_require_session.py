"""An MCP tool that names a session acts on it only if it exists: loaded on this replica, or in the
session registry (paused, another replica's, not used since a restart); never a new empty one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from execbox.errors import SessionNotFoundError
from execbox.mcp.core import Caller, ServiceCore


def _core(loaded: object = None, row: object = None) -> ServiceCore:
    sessions = SimpleNamespace(get=lambda t, s: loaded, registry=SimpleNamespace(get=lambda t, s: row))
    return ServiceCore(sessions, runs=None, default_timeout=30)  # type: ignore[arg-type]


def test_a_loaded_session_or_a_registry_row_counts():
    _core(loaded=SimpleNamespace(closed=False)).require_session(Caller("t"), "s1")
    _core(row=SimpleNamespace(state="running")).require_session(Caller("t"), "s1")  # e.g. after a restart


@pytest.mark.parametrize("loaded", [None, SimpleNamespace(closed=True)])
def test_neither_is_session_not_found_naming_it(loaded):
    with pytest.raises(SessionNotFoundError) as e:
        _core(loaded=loaded).require_session(Caller("t"), "s1-typo")
    assert e.value.details == {"session_id": "s1-typo"} and "create_session" in e.value.message
