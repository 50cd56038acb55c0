"""Background processes survive a restart of a real `execbox serve` on the Docker provider (runc):
SIGTERM leaves the session's container and its processes running, and the restarted service
adopts them from the re-attached agent (service/background.py ``ProcessTable.adopt``): they are
listed with their command and cwd, their output is read on from what the box still holds, stdin
and signals reach them, their exit arrives, and they count against the tenant's cap."""

from __future__ import annotations

import time

import httpx

from tests.conftest import require
from tests.integration.docker.conftest import runtimes_of
from tests.integration.docker.test_session_restart import _docker_service, _labelled
from tests.integration.service.test_serve_cli import _serve, _wait_ready
from tests.integration.service.test_session_restart import _term

PATH = "/v1/sandbox/sessions/t1/bg/processes"
TICKER = "for i in $(seq 1 100000); do echo tick-$i; sleep 0.2; done"
READER = "while read x; do echo got-$x; done; echo eof"


def _read_until(c: httpx.Client, pid: int, want: str, offset: int = 0, seconds: float = 60) -> tuple[str, dict]:
    """Output of ``pid`` from ``offset`` until ``want`` is in it (or it ended); (text, first answer)."""
    text, first = "", None
    deadline = time.monotonic() + seconds
    while True:
        assert time.monotonic() < deadline, text[-500:]
        r = c.get(f"{PATH}/{pid}", params={"stdout_offset": offset, "wait": 5})
        assert r.status_code == 200, r.text
        body = r.json()
        first = first or body
        text, offset = text + body["stdout"], body["stdout_offset"]
        if want in text or not body["running"]:
            return text, first


def test_background_processes_are_adopted_after_a_restart(docker_engine) -> None:
    require("runc" in runtimes_of(docker_engine), "docker runtime runc")
    env, tenant, admin, label = _docker_service("execbox-dkbg-", "r-dkbg", "runc")
    auth = {"Authorization": f"Bearer {tenant}"}
    try:
        proc, url = _serve(env)
        try:
            _wait_ready(proc, url)
            c = httpx.Client(base_url=url, headers=auth, timeout=120)
            r = c.post("/v1/sandbox/write", json={"session_id": "bg", "path": "sub/keep", "content": "x"})
            assert r.status_code == 200, r.text
            r = c.post(PATH, json={"command": TICKER, "cwd": "sub", "timeout": 3600})
            assert r.status_code == 201, r.text
            ticker = r.json()
            r = c.post(PATH, json={"command": READER, "stdin": True})
            assert r.status_code == 201, r.text
            reader = r.json()
            before, _ = _read_until(c, ticker["pid"], "tick-2\n")
            assert before.startswith("tick-1\ntick-2\n")
        finally:
            _term(proc)
        time.sleep(1.0)  # the ticker writes on while no service runs

        proc, url = _serve({**env, "SANDBOX_TENANT_MAX_BACKGROUND_PROCESSES": "2"})
        try:
            _wait_ready(proc, url)
            c = httpx.Client(base_url=url, headers=auth, timeout=120)
            r = c.get(PATH)
            assert r.status_code == 200, r.text
            listed = {p["pid"]: p for p in r.json()["processes"]}
            assert set(listed) == {ticker["pid"], reader["pid"]}, r.text
            for was in (ticker, reader):
                now = listed[was["pid"]]
                assert now["running"] is True and now["status"] == "running"
                for key in ("command", "cwd", "stdin", "timeout"):
                    assert now[key] == was[key], key
                assert abs(now["started_at"] - was["started_at"]) < 1e-3
            # all of its output is still in the box: read from the start, written before the
            # restart, while no service ran, and after
            text, first = _read_until(c, ticker["pid"], "tick-12\n")
            assert first["stdout_skipped"] == 0 and first["stdout_dropped"] == 0
            assert text.startswith("tick-1\ntick-2\n") and "tick-12\n" in text
            # the tenant's cap (2) counts the two adopted processes
            r = c.post(PATH, json={"command": "sleep 30"})
            assert r.status_code == 429, r.text
            assert r.json()["error"]["details"]["reason"] == "tenant_max_background_processes"

            r = c.post(f"{PATH}/{reader['pid']}/stdin", json={"data": "hello\n", "close": True})
            assert r.status_code == 200 and r.json()["stdin"] is False, r.text
            text, _ = _read_until(c, reader["pid"], "eof\n")
            assert text == "got-hello\neof\n"
            r = c.post(f"{PATH}/{ticker['pid']}/signal", json={"signal": "SIGTERM"})
            assert r.status_code == 200 and r.json()["signalled"] is True, r.text
            ended = {}
            deadline = time.monotonic() + 60
            while len(ended) < 2:
                assert time.monotonic() < deadline, ended
                for pid in (ticker["pid"], reader["pid"]):
                    body = c.get(f"{PATH}/{pid}", params={"stdout_offset": 1 << 40, "wait": 2}).json()
                    if not body["running"]:
                        ended[pid] = body
            assert ended[reader["pid"]]["status"] == "exited" and ended[reader["pid"]]["exit_code"] == 0
            assert ended[ticker["pid"]]["status"] == "signalled" and ended[ticker["pid"]]["signal"] == 15
            r = c.post(PATH, json={"command": "sleep 30"})  # they ended: a start fits again
            assert r.status_code == 201, r.text
            r = httpx.delete(f"{url}/v1/sandbox/sessions/t1/bg", headers={"Authorization": f"Bearer {admin}"},
                             timeout=120)
            assert r.status_code == 200, r.text
        finally:
            _term(proc)
    finally:
        for k in _labelled(docker_engine, label):
            k.remove(force=True)
