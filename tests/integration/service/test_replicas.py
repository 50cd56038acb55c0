"""Two real `execbox serve` replicas on one real PostgreSQL and one workspace root (jail):
a session created through one is used through the other (forwarded to its owner, contexts
included), the per-tenant quota holds under concurrent creates on both, and when the owner is
killed the other takes the session over with its files."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import httpx

from execbox.sdk.wire import iter_events
from execbox.service.store import open_store
from tests.integration.store.conftest import new_pg_database, pg_server  # noqa: F401 - fixture

from .conftest import free_port, traversable_tmpdir
from .test_serve_cli import EXECBOX, _wait_ready
from .test_session_restart import _term


def _replica(base: str, db: str, name: str, log_to_file: bool = False,
             **extra: str) -> tuple[subprocess.Popen, str]:
    """One `execbox serve` replica on the shared database; ``extra``: more env (default: a quota of 3).
    ``log_to_file``: its stderr to ``<base>/<name>.log`` (a pipe nobody reads would fill up)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "EXECBOX_DATA_DIR": os.path.join(base, f"data-{name}"), "EXECBOX_DATABASE_URL": db,
           "EXECBOX_WORKSPACES_DIR": os.path.join(base, "ws"), "SANDBOX_TYPE": "jail",
           "EXECBOX_REPLICA_ID": name, "EXECBOX_REPLICA_URL": url, "EXECBOX_INTERNAL_SECRET": "s3cret-shared",
           "EXECBOX_SESSION_LEASE": "2", **(extra or {"SANDBOX_TENANT_MAX_SESSIONS": "3"})}
    if log_to_file:
        with open(os.path.join(base, f"{name}.log"), "wb") as log:
            proc = subprocess.Popen([EXECBOX, "serve", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                                    stderr=log)
    else:
        proc = subprocess.Popen([EXECBOX, "serve", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
    return proc, url


def test_two_replicas_share_sessions_quota_and_take_over(pg_server) -> None:  # noqa: F811
    db = new_pg_database(pg_server)
    base = traversable_tmpdir("execbox-replicas-")
    with open_store(data_dir=os.path.join(base, "data-setup"), url=db) as store:
        _, token = store.tokens.create("t1")
    auth = {"Authorization": f"Bearer {token}"}
    (pa, ua), (pb, ub) = _replica(base, db, "ra"), _replica(base, db, "rb")
    try:
        _wait_ready(pa, ua)
        _wait_ready(pb, ub)
        a = httpx.Client(base_url=ua, headers=auth, timeout=60)
        b = httpx.Client(base_url=ub, headers=auth, timeout=60)
        r = a.post("/v1/sandbox/execute", json={"session_id": "s", "context_id": "c",
                                                 "code": "x = 7\nopen('f', 'w').write('shared')"})
        assert r.status_code == 200, r.text
        r = b.post("/v1/sandbox/execute", json={"session_id": "s", "context_id": "c",
                                                 "code": "print(x * 6, open('f').read())"})
        assert r.status_code == 200, r.text
        assert r.json()["stdout"] == "42 shared\n" and r.headers["x-execbox-served-by"] == ua  # forwarded
        r = b.post("/v1/sandbox/read", json={"session_id": "s", "path": "f"})
        assert r.status_code == 200 and r.json()["content"] == "shared"
        _streamed_runs_are_forwarded(b, ua)
        info = b.get("/v1/sandbox/sessions/t1/s").json()
        assert info["owner"] == "ra" and info["state"] == "running"
        # a forged internal header is refused
        r = httpx.post(f"{ub}/v1/sandbox/read", headers={**auth, "x-execbox-forwarded": "ra:1:00"},
                       json={"session_id": "s", "path": "f"})
        assert r.status_code == 403

        codes: list[int] = []
        barrier = threading.Barrier(8)

        def create(i: int) -> None:
            c = httpx.Client(base_url=(ua, ub)[i % 2], headers=auth, timeout=60)
            barrier.wait()
            codes.append(c.post("/v1/sandbox/write", json={"session_id": f"q{i}", "path": "n", "content": "1"}
                                ).status_code)

        threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(codes) == [200, 200] + [429] * 6  # 3 per tenant, "s" already holds one

        pa.send_signal(signal.SIGKILL)  # the owner dies without draining
        pa.wait(timeout=30)
        deadline = time.monotonic() + 20
        while True:
            r = b.post("/v1/sandbox/execute", json={"session_id": "s", "context_id": "c",
                                                     "code": "print(open('f').read(), globals().get('x'))"})
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.5)  # until ra's lease (2 s) runs out
        assert r.status_code == 200, r.text
        assert r.json()["stdout"] == "shared None\n" and r.json()["metadata"]["session"] == {"contexts_lost": True}
        assert b.get("/v1/sandbox/sessions/t1/s").json()["owner"] == "rb"
    finally:
        for p in (pa, pb):
            if p.poll() is None:
                _term(p)


def _streamed_runs_are_forwarded(b: httpx.Client, owner_url: str) -> None:
    """A streamed run through the replica that does not own the session: the owner's events are
    relayed as they happen, and closing the stream cancels the run at the owner."""
    with b.stream("POST", "/v1/sandbox/execute", json={
            "session_id": "s", "context_id": "c", "stream": True,
            "code": "import sys\nprint(x * 6, flush=True)\nprint('e', file=sys.stderr)"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-execbox-served-by"] == owner_url
        events = list(iter_events(r.iter_lines()))
    assert [e for e, _ in events] == ["stdout", "stderr", "result"], events
    assert events[0][1]["text"] == "42\n" and events[-1][1]["exit_code"] == 0
    code = "print('first', flush=True)\nimport time\ntime.sleep(20)\nopen('late', 'w').write('1')"
    with b.stream("POST", "/v1/sandbox/execute", json={"session_id": "s", "stream": True, "code": code}) as r:
        for line in r.iter_lines():  # the first event arrives while the run is still sleeping
            if "first" in line:
                break
        else:
            raise AssertionError("the stream ended before the run's first output")
    # closed mid-run: the owner cancels it (else this queues behind it for 20 s, then 'late' exists)
    r = b.post("/v1/sandbox/execute", json={"session_id": "s", "code": "import os; print(os.path.exists('late'))"})
    assert r.status_code == 200 and r.json()["stdout"] == "False\n", r.text
