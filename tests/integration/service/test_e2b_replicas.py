"""E2B's own SDK against two real `execbox serve` replicas on one PostgreSQL: a sandbox created
through one is used, paused, resumed and killed through the other. Its row is in the store
(e2b_compat/persist.py); sandbox URL requests are relayed as streams to the replica that owns
its session (e2b_compat/forward.py), control-plane requests go there by the service's own
forwarding."""

from __future__ import annotations

import os

import httpx
import pytest

from execbox.service.store import open_store
from tests.integration.store.conftest import new_pg_database, pg_server  # noqa: F401 - fixture

from .conftest import traversable_tmpdir
from .test_replicas import _replica
from .test_serve_cli import _wait_ready
from .test_session_restart import _term

e2b = pytest.importorskip("e2b")
ci = pytest.importorskip("e2b_code_interpreter")


def _use(monkeypatch: pytest.MonkeyPatch, url: str, token: str) -> None:
    monkeypatch.setenv("E2B_API_URL", url)
    monkeypatch.setenv("E2B_SANDBOX_URL", url)
    monkeypatch.setenv("E2B_API_KEY", token)


def test_a_sandbox_made_on_one_replica_is_served_through_the_other(pg_server, monkeypatch) -> None:  # noqa: F811
    for name in ("E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    from execbox.service.crypto import encode_key, generate_key

    monkeypatch.setenv("EXECBOX_SECRET_KEY", encode_key(generate_key()))  # shared, as docs/sessions.md says
    db = new_pg_database(pg_server)
    base = traversable_tmpdir("execbox-e2b-replicas-")
    with open_store(data_dir=os.path.join(base, "data-setup"), url=db) as store:
        _, token = store.tokens.create("t1")
    (pa, ua), (pb, ub) = _replica(base, db, "ra"), _replica(base, db, "rb")
    try:
        _wait_ready(pa, ua)
        _wait_ready(pb, ub)
        _use(monkeypatch, ua, token)
        made = ci.Sandbox.create(timeout=300, envs={"GREETING": "hej"}, metadata={"where": "ra"})
        made.files.write("/home/user/a.txt", "written via ra")
        assert made.run_code("x = 20").error is None
        sid = made.sandbox_id

        _use(monkeypatch, ub, token)
        there = ci.Sandbox.connect(sid)  # rb reads the sandbox from the store
        assert there.files.read("/home/user/a.txt") == "written via ra"
        assert there.run_code("x + 22").text == "42"  # ra's context: the cell was relayed to the owner
        r = there.commands.run("echo $GREETING; cat /home/user/a.txt")
        assert r.stdout == "hej\nwritten via ra"
        r = httpx.get(f"{ub}/health", headers={"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983",
                                                "X-Access-Token": there._envd_access_token})
        assert r.headers.get("x-execbox-served-by") == ua  # relayed, not served by rb
        forged = httpx.get(f"{ub}/health", headers={"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983",
                                                     "X-Access-Token": there._envd_access_token,
                                                     "x-execbox-forwarded": "ra:1:00"})
        assert forged.status_code == 403  # a forwarding marker that does not verify
        lines: list[str] = []
        handle = there.commands.run("for i in 1 2 3; do echo $i; sleep 0.2; done", background=True)
        assert handle.wait(on_stdout=lines.append).exit_code == 0
        assert "".join(lines).split() == ["1", "2", "3"]  # the owner's output stream, relayed
        info = e2b.Sandbox.get_info(sid)
        assert info.metadata == {"where": "ra"}
        there.set_timeout(600)
        _use(monkeypatch, ua, token)
        assert e2b.Sandbox.get_info(sid).end_at == e2b.Sandbox.get_info(sid).end_at  # rb's deadline is ra's
        assert abs((e2b.Sandbox.get_info(sid).end_at - info.end_at).total_seconds() - 300) < 30

        _use(monkeypatch, ub, token)
        assert there.pause() is True  # forwarded to ra, which holds the box
        assert e2b.Sandbox.get_info(sid).state == e2b.SandboxState.PAUSED
        back = ci.Sandbox.connect(sid)
        assert back.files.read("/home/user/a.txt") == "written via ra"
        assert back.kill() is True
        _use(monkeypatch, ua, token)
        with pytest.raises(e2b.NotFoundException):
            e2b.Sandbox.connect(sid)
    finally:
        for p in (pa, pb):
            if p.poll() is None:
                _term(p)
