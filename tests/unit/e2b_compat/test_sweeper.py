"""The E2B sweeper with a real store (SQLite) and a stand-in session manager: each replica keeps
only what it uses, never queries per sandbox for other replicas' sessions, reaps orphan sessions,
and tokens follow a key rotation at once."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from execbox.service import crypto
from execbox.service.e2b_compat import sweeper
from execbox.service.e2b_compat.persist import SandboxStore
from execbox.service.e2b_compat.registry import E2BSandbox, Registry
from execbox.service.sessions.model import SessionOwnedElsewhere
from execbox.service.store import open_store


class Sessions:
    """What the registry uses of a SessionManager: nothing is loaded here, another replica owns all."""

    def __init__(self) -> None:
        self.lookups = 0
        self.destroyed: list[tuple[str, str]] = []
        self.loaded: list[tuple[str, str, float]] = []
        self.settings = SimpleNamespace(idle_timeout=900)
        self.registry = SimpleNamespace(get=self._lookup)

    def _lookup(self, tenant: str, session_id: str) -> object:
        self.lookups += 1
        return SimpleNamespace(created_at=1.0, state="running")

    def get(self, tenant: str, session_id: str) -> None:
        return None

    def check_owner(self, tenant: str, session_id: str) -> None:
        raise SessionOwnedElsewhere("elsewhere", forward_to="http://ra:8000")

    def loaded_sessions(self, prefix: str = "") -> list[tuple[str, str, float]]:
        return [x for x in self.loaded if x[1].startswith(prefix)]

    def destroy(self, tenant: str, session_id: str) -> dict:
        self.destroyed.append((tenant, session_id))
        return {}


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("EXECBOX_SECRET_KEY", crypto.encode_key(crypto.generate_key()))
    ring = {"now": crypto.load_keyring(tmp_path)}
    with open_store(data_dir=tmp_path) as store:
        sessions = Sessions()
        reg = Registry(sessions, store=SandboxStore(store.e2b, lambda: ring["now"]))  # type: ignore[arg-type]
        yield reg, sessions, store, ring


def _add(reg: Registry, sid: str, **kw) -> E2BSandbox:
    sb = E2BSandbox(sid, "t", "base", {}, {}, time.time() + 300, session_created=1.0, **kw)
    reg.store.insert(sb)  # as another replica's create would: this one never saw it
    return sb


def test_other_replicas_sandboxes_cost_no_query_each_and_leave_the_cache(world, monkeypatch):
    reg, sessions, store, _ = world
    for i in range(5):
        _add(reg, f"sb{i}")
    assert len(reg.of_tenant("t")) == 5  # read here once (a listing): now cached
    before = sessions.lookups
    for sb in list(reg._boxes.values()):
        reg._follow_pause(sb)
    assert sessions.lookups == before  # pause tracking asks nothing for sessions not loaded here
    assert [sb for sb in reg._rows(store.e2b.running, time.time()) if reg._mine_to_keep(sb)] == []
    monkeypatch.setattr(sweeper, "CACHE_IDLE", 0.0)
    reg._trim_cache()
    assert reg._boxes == {}  # not used here: not kept
    store.e2b.delete("sb0")
    assert reg.get("sb0") is None and reg.get("sb1") is not None  # the rows stay the truth


def test_only_a_session_of_a_sandbox_this_replica_ended_is_taken_for_an_orphan(world):
    reg, sessions, store, _ = world
    _add(reg, "alive")
    reg.ended(E2BSandbox("killed", "t", "base", {}, {}, time.time()))
    sessions.loaded = [("t", "e2b-alive", 0.0), ("t", "e2b-killed", 0.0),  # made afresh after the kill
                       ("t", "e2b-myproject", 0.0),  # a tenant's own session of that shape: never
                       ("u", "e2b-killed", 0.0)]  # another tenant's session of that name: never
    reg._reap_orphans()
    deadline = time.monotonic() + 5
    while not sessions.destroyed and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert sessions.destroyed == [("t", "e2b-killed")]


def test_tokens_follow_a_key_rotation_on_the_next_read(world, monkeypatch):
    reg, _, _, ring = world
    _add(reg, "rot")
    old_token = reg.get("rot", fresh=True).access_token
    ring["now"] = crypto.KeyRing(crypto.generate_key(), "EXECBOX_SECRET_KEY", [])  # the old key dropped
    sb = reg.get("rot", fresh=True)
    assert not sb.token_ok(old_token) and sb.token_ok(sb.access_token) and sb.access_token != old_token


def test_moving_a_paused_sandboxs_deadline_changes_what_it_has_left(world):
    reg, _, _, _ = world
    _add(reg, "nap")
    sb = reg.get("nap", fresh=True)
    reg.paused(sb)
    reg.set_deadline(sb, 1000)  # set_timeout while paused
    assert reg.get("nap", fresh=True).paused_left == 1000
    reg.set_deadline(sb, 10, extend_only=True)  # a refresh never shortens it
    assert reg.get("nap", fresh=True).paused_left == 1000
    reg.resumed(sb)
    assert 990 < sb.end_at - time.time() <= 1000
    reg.set_deadline(sb, 10, extend_only=True)
    assert sb.end_at - time.time() > 990
