"""A file operation is filed when it starts, like a run (review 21): one cut off by a crash of the
service is audited `interrupted` at the next start instead of leaving no record (a copy that had
changed files left none). The operation held open here is a grep whose pattern backtracks until
the agent's search time limit (30 s), so the kill lands inside it."""

from __future__ import annotations

import json
import os
import threading
import time

import httpx
from sqlalchemy import select

from execbox.service.logs import code_hash
from execbox.service.store import open_store
from execbox.service.store.models import AuditInflight

from .conftest import traversable_tmpdir
from .test_serve_cli import _serve, _wait_ready
from .test_session_restart import _env, _kill_now, _term, _token


def _filed(data: str) -> bool:
    """Whether the store holds what the kill must find: the grep filed as started (audit_inflight)
    and the write's audit row."""
    with open_store(data_dir=data, migrate=False) as store:
        with store.engine.connect() as conn:
            started = [json.loads(r.record) for r in conn.execute(select(AuditInflight))]
        rows = store.audit.list(tenant_id="t1")
    return (any(r.get("operation") == "grep" and r.get("session_id") == "g" for r in started)
            and any(r["operation"] == "write_file" and r["session_id"] == "g" for r in rows))


def test_a_file_operation_cut_off_by_sigkill_is_audited_as_interrupted(jail_provider) -> None:
    base = traversable_tmpdir("execbox-fileop-")
    env, auth = _env(base), _token(base)
    data = os.path.join(base, "data")
    proc, url = _serve(env)
    try:
        _wait_ready(proc, url)
        c = httpx.Client(base_url=url, headers=auth, timeout=90)
        assert c.post("/v1/sandbox/write", json={"session_id": "g", "path": "slow.txt",
                                                 "content": "a" * 40 + "b"}).status_code == 200
        def grep() -> None:
            try:
                c.post("/v1/sandbox/grep", json={"session_id": "g", "pattern": "(a+)+$", "path": "."})
            except httpx.HTTPError:  # the service is killed under it
                pass

        threading.Thread(target=grep, daemon=True).start()
        deadline = time.monotonic() + 30  # the audit writer's batches go out every 50 ms
        while not _filed(data) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _filed(data), "the grep was not filed as started, or the write's row did not come"
        proc.kill()  # inside the grep (it runs up to 30 s); no drain, no final audit rows
    finally:
        _kill_now(proc)
    proc, url = _serve(env)
    try:
        _wait_ready(proc, url)
        with open_store(data_dir=data) as store:
            rows = [r for r in store.audit.list(tenant_id="t1") if r["session_id"] == "g"]
        by_op = {r["operation"]: r for r in rows}
        assert by_op["write_file"]["status"] == "success", rows
        assert by_op["grep"]["status"] == "interrupted" and by_op["grep"]["code_hash"] == code_hash("."), rows
        assert by_op["grep"]["language"] == "files" and by_op["grep"]["provider"] == "jail"
    finally:
        _term(proc)
