"""The session registry on SQLite and a real PostgreSQL: migration 0003, quotas that hold when two
"replicas" (two engines) create concurrently, leases, SKIP LOCKED adoption, expiry."""

from __future__ import annotations

import threading
import time

import pytest

from execbox.errors import InstanceCreationError, RateLimitError
from execbox.service.store import open_store
from execbox.service.store.engine import _alembic_config, current_revision, head_revision, upgrade


def _create(reg, tenant: str, sid: str, owner: str, tenant_limit: int = 20, global_limit: int = 50, ttl: float = 30):
    return reg.create(tenant, sid, provider="jail", runtime="python", owner=owner, lease_ttl=ttl,
                      tenant_limit=tenant_limit, global_limit=global_limit)


def test_migration_0003_and_record_round_trip(db_url, tmp_path) -> None:
    with open_store(data_dir=tmp_path, url=db_url) as store:
        assert current_revision(store.engine) >= "0003"
        reg = store.sessions
        rec, created = _create(reg, "t", "s", "r1")
        assert created and rec.state == "creating" and rec.owner == "r1" and rec.lease_live()
        again, created = _create(reg, "t", "s", "r2")
        assert not created and again.id == rec.id
        reg.update("t", "s", state="running", box_handle={"instance_id": "i1", "workspace": "/w"},
                   network_policy={"allow": ["pypi.org"]})
        got = reg.get("t", "s")
        assert got.state == "running" and got.box_handle == {"instance_id": "i1", "workspace": "/w"}
        assert got.network_policy == {"allow": ["pypi.org"]}
        assert [r.session_id for r in reg.list("t")] == ["s"] and reg.list("other") == []
        assert reg.delete("t", "s") and reg.get("t", "s") is None
        _downgrade(store.engine, "0002")  # the migration goes down cleanly and back up
        assert current_revision(store.engine) == "0002"
        upgrade(store.engine, "head")
        assert current_revision(store.engine) == head_revision()


def _downgrade(engine, revision: str) -> None:
    """Alembic's downgrade (execbox offers none: `upgrade` to an older revision is refused, and
    before review 50 it silently did nothing, so this test never went down at all)."""
    from alembic import command

    cfg = _alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def test_tenant_quota_holds_across_two_replicas_under_concurrent_creates(db_url, tmp_path) -> None:
    one, two = open_store(data_dir=tmp_path, url=db_url), open_store(data_dir=tmp_path, url=db_url, migrate=False)
    outcomes: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(16)

    def create(i: int) -> None:
        reg = (one if i % 2 else two).sessions
        barrier.wait()
        try:
            _, created = _create(reg, "q", f"s{i}", f"r{i % 2}", tenant_limit=3)
            result = "created" if created else "existing"
        except RateLimitError:
            result = "429"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert outcomes.count("created") == 3 and outcomes.count("429") == 13
        assert len(one.sessions.list("q")) == 3
        # the service-wide limit counts running/creating only: a paused session frees a slot
        with pytest.raises(InstanceCreationError):
            _create(one.sessions, "other", "x", "r1", global_limit=3)
        one.sessions.update("q", one.sessions.list("q")[0].session_id, state="paused")
        assert _create(one.sessions, "other", "x", "r1", global_limit=3)[1]
    finally:
        one.close()
        two.close()


def test_leases_claims_and_skip_locked_adoption(db_url, tmp_path) -> None:
    with open_store(data_dir=tmp_path, url=db_url) as store:
        reg = store.sessions
        for i in range(6):
            _create(reg, "t", f"s{i}", "dead", ttl=0.2)
        _create(reg, "t", "live", "alive", ttl=60)
        assert reg.claim("t", "live", "r1", 30) is None  # another replica's live lease
        time.sleep(0.3)
        got: dict[str, list[str]] = {}

        def adopt(me: str) -> None:
            got[me] = [r.session_id for r in reg.adoptable(me, 30)]

        threads = [threading.Thread(target=adopt, args=(me,)) for me in ("r1", "r2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(got["r1"] + got["r2"]) == [f"s{i}" for i in range(6)]  # each row adopted once
        assert not set(got["r1"]) & set(got["r2"])
        owner = {r.session_id: r.owner for r in reg.list("t")}
        assert owner["live"] == "alive" and all(owner[s] in ("r1", "r2") for s in got["r1"] + got["r2"])
        reg.heartbeat("r1", 30, {("t", got["r1"][0]): 123.0} if got["r1"] else {}, url="http://r1")
        assert {r["id"]: r["url"] for r in reg.replicas()} == {"r1": "http://r1"}
        reg.update("t", "s0", state="paused", expires_at=time.time() - 1)
        assert [r.session_id for r in reg.expired(time.time())] == ["s0"]
        reg.leave("r1")
        assert reg.replicas() == []


def _delete_only_while_it_still_records(reg) -> None:
    rec, _ = _create(reg, "t", "gone", "r1")
    reg.update("t", "gone", state="closing")
    assert not reg.delete("t", "gone", owner="r2", state="closing")  # another replica's destroy
    assert not reg.delete("t", "gone", row_id="0" * 32, owner="r1")  # a new session of the name
    assert not reg.delete("t", "gone", owner="r1", state="running")
    assert reg.get("t", "gone") is not None
    assert reg.delete("t", "gone", row_id=rec.id, owner="r1", state="closing") and reg.get("t", "gone") is None


def test_a_late_destroyer_deletes_a_row_only_while_it_still_records_its_destroy(db_url, tmp_path) -> None:
    """(review 21) one conditional statement: nothing between a re-read and the delete."""
    with open_store(data_dir=tmp_path, url=db_url) as store:
        _delete_only_while_it_still_records(store.sessions)


def test_the_memory_registry_deletes_on_the_same_conditions() -> None:
    from execbox.service.sessions.registry import MemoryRegistry

    _delete_only_while_it_still_records(MemoryRegistry())
