"""A tenant can end its own session, and a session made by a call says so (review 29, findings 4-5).

- ``POST sessions/{tenant}/{session}/close``: the session's own tenant (or an admin) ends it, with
  DELETE's teardown; DELETE stays admin only. A tenant that opens a session per task is no longer
  locked out at SANDBOX_TENANT_MAX_SESSIONS until idle expiry, and the 429 says how to free a
  slot, with a Retry-After that can come true (or none).
- A session created by a call is visible: ``X-Execbox-Session-Created: true`` on the answer,
  ``metadata.session.created`` in a run's result (``recreated`` / ``previous`` when the same id
  ended before), and ``X-Execbox-Create-Session: false`` makes an unknown session 404.
- A running session's ``expires_at`` is its idle expiry, not null.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from .conftest import Service, error_of

CREATED = "x-execbox-session-created"


def _run(c, session_id: str, code: str = "1", headers: dict[str, str] | None = None, **kw):
    return c.post("/v1/sandbox/execute", json={"code": code, "session_id": session_id, **kw}, headers=headers)


def test_a_tenant_closes_its_own_session_and_only_its_own(service: Service) -> None:
    sessions = service.app.state.services.sessions
    assert _run(service.a, "mine", "open('f.txt', 'w').write('x')").status_code == 200
    assert _run(service.b, "theirs").status_code == 200
    workspace = sessions.get("tenant-a", "mine").workspace
    assert os.path.isdir(workspace)

    assert service.a.delete("/v1/sandbox/sessions/tenant-a/mine").status_code == 403  # DELETE: admin only
    assert service.a.post("/v1/sandbox/sessions/tenant-b/theirs/close").status_code == 403
    assert sessions.get("tenant-b", "theirs") is not None

    r = service.a.post("/v1/sandbox/sessions/tenant-a/mine/close")
    assert r.status_code == 200, r.text
    assert r.json()["destroyed"]["state"] == "closed" and r.json()["destroyed"]["session_id"] == "mine"
    assert sessions.get("tenant-a", "mine") is None and sessions.registry.get("tenant-a", "mine") is None
    assert not os.path.exists(workspace)

    again = service.a.post("/sessions/tenant-a/mine/close")  # the direct path too; gone now: 404
    assert again.status_code == 404 and error_of(again)["code"] == "SB002"
    assert service.a.post("/v1/sandbox/sessions/tenant-a/never-was/close").status_code == 404
    assert service.root.post("/v1/sandbox/sessions/tenant-b/theirs/close").status_code == 200  # admin: any tenant


def test_at_the_session_quota_closing_one_frees_a_slot_and_retry_after_is_the_idle_expiry(service_factory) -> None:
    svc: Service = service_factory(tenant_max_sessions=2, idle_timeout=600, reap_interval=5)
    for sid in ("q1", "q2"):
        assert _run(svc.a, sid).status_code == 200
    r = _run(svc.a, "q3")
    assert r.status_code == 429
    err = error_of(r)
    assert err["details"]["reason"] == "tenant_max_sessions"
    assert "/close" in err["message"] and "RemoteSandbox.close()" in err["message"]
    wait = int(r.headers["retry-after"])
    assert 590 <= wait <= 606, wait  # the first idle session's expiry (600 s) plus a sweep, not "1"
    assert err["details"]["retry_after"] == wait

    assert svc.a.post("/v1/sandbox/sessions/tenant-a/q1/close").status_code == 200
    assert _run(svc.a, "q3").status_code == 200


def test_no_retry_after_when_no_session_of_the_tenant_can_expire(service_factory) -> None:
    svc: Service = service_factory(tenant_max_sessions=1, idle_timeout=600)
    busy = threading.Thread(target=lambda: _run(svc.client(svc.tenant_a), "long", "import time; time.sleep(4)"))
    busy.start()
    sessions = svc.app.state.services.sessions
    deadline = time.monotonic() + 20
    while not (sessions.get("tenant-a", "long") and sessions.get("tenant-a", "long").running):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = _run(svc.a, "other")
    busy.join()
    assert r.status_code == 429 and "retry-after" not in r.headers  # retrying alone cannot succeed
    assert error_of(r)["details"]["retry_after"] is None
    assert "none of its sessions is idle" in error_of(r)["message"]


def test_the_call_that_creates_a_session_says_so(service: Service) -> None:
    first = _run(service.a, "fresh", "x = 1")
    assert first.status_code == 200 and first.headers.get(CREATED) == "true"
    assert first.json()["metadata"]["session"] == {"created": True}
    second = _run(service.a, "fresh", "x")
    assert CREATED not in second.headers and "created" not in second.json()["metadata"].get("session", {})

    write = service.a.post("/v1/sandbox/write", json={"session_id": "by-a-file", "path": "a.txt", "content": "a"})
    assert write.status_code == 200 and write.headers.get(CREATED) == "true"  # any route that names a session
    read = service.a.post("/v1/sandbox/read", json={"session_id": "by-a-file", "path": "a.txt"})
    assert read.status_code == 200 and CREATED not in read.headers

    bash = service.a.post("/v1/sandbox/bash", json={"command": "true", "session_id": "by-bash"})
    assert bash.headers.get(CREATED) == "true" and bash.json()["metadata"]["session"]["created"] is True
    one_shot = service.a.post("/v1/sandbox/execute", json={"code": "1"})
    assert CREATED not in one_shot.headers


def test_a_session_made_again_under_a_used_id_says_how_the_old_one_ended(service: Service) -> None:
    assert _run(service.a, "again", "open('data.txt', 'w').write('x')").status_code == 200
    assert service.a.post("/v1/sandbox/sessions/tenant-a/again/close").status_code == 200
    r = _run(service.a, "again", "print(open('data.txt').read())")
    assert r.status_code == 200 and r.headers.get(CREATED) == "true"
    session = r.json()["metadata"]["session"]
    assert session["created"] is True and session["recreated"] is True
    assert session["previous"]["ended"] == "closed" and session["previous"]["ended_at"] <= time.time()
    assert "FileNotFoundError" in r.json()["stderr"]  # the workspace is new: the model is told why


def test_create_session_false_makes_an_unknown_session_404(service: Service) -> None:
    no = {"X-Execbox-Create-Session": "false"}
    r = service.a.post("/v1/sandbox/read", json={"session_id": "typo", "path": "f"}, headers=no)
    assert r.status_code == 404
    err = error_of(r)
    assert err["code"] == "SB002" and err["details"]["reason"] == "not_created"
    assert "X-Execbox-Create-Session" in err["message"]
    sessions = service.app.state.services.sessions
    assert sessions.registry.get("tenant-a", "typo") is None  # no box, no quota slot taken
    r = _run(service.a, "typo", headers=no)
    assert r.status_code == 404 and sessions.get("tenant-a", "typo") is None

    assert _run(service.a, "known").status_code == 200
    used = _run(service.a, "known", "2", headers=no)
    assert used.status_code == 200 and CREATED not in used.headers  # an existing session is used as ever
    assert service.a.post("/v1/sandbox/sessions/tenant-a/known/close").status_code == 200
    gone = _run(service.a, "known", headers=no)
    assert gone.status_code == 404 and "it was closed" in error_of(gone)["message"]
    assert error_of(gone)["details"]["previous"]["ended"] == "closed"

    bad = _run(service.a, "known", headers={"X-Execbox-Create-Session": "perhaps"})
    assert bad.status_code == 400 and error_of(bad)["details"]["header"] == "X-Execbox-Create-Session"


def test_create_session_takes_exactly_true_or_false_once(service: Service) -> None:
    """Review 31, F7: 0/1/yes/no were taken although the docs say anything but true/false is 400,
    and a header sent twice silently meant its first value."""
    h = "X-Execbox-Create-Session"
    for value in ("1", "0", "yes", "no", "", "true, false"):
        r = _run(service.a, "strict", headers={h: value})
        assert r.status_code == 400 and error_of(r)["code"] == "SB002", (value, r.text)
        assert error_of(r)["details"]["header"] == h and "must be true or false" in error_of(r)["message"]
    assert service.app.state.services.sessions.registry.get("tenant-a", "strict") is None
    twice = service.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "strict"},
                           headers=[(h, "false"), (h, "true")])
    assert twice.status_code == 400 and "more than once with different values" in error_of(twice)["message"]
    r = _run(service.a, "strict", headers={h: "FALSE"})
    assert r.status_code == 404 and error_of(r)["details"]["reason"] == "not_created"
    same = service.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "strict"},
                          headers=[(h, "True"), (h, "true")])
    assert same.status_code == 200 and same.headers.get(CREATED) == "true", same.text


def test_a_reaped_session_made_again_says_it_was_idle_too_long(service_factory) -> None:
    svc: Service = service_factory(idle_timeout=0.5, reap_interval=0.1)
    assert _run(svc.a, "nap").status_code == 200
    sessions = svc.app.state.services.sessions
    deadline = time.monotonic() + 10
    while sessions.registry.get("tenant-a", "nap") is not None:
        assert time.monotonic() < deadline, "not reaped"
        time.sleep(0.05)
    r = _run(svc.a, "nap")
    assert r.json()["metadata"]["session"]["previous"]["ended"] == "idle_timeout"
    assert "SANDBOX_IDLE_TIMEOUT" in r.json()["metadata"]["session"]["previous"]["why"]


def test_a_running_sessions_expires_at_is_its_idle_expiry(service_factory) -> None:
    svc: Service = service_factory(idle_timeout=300)
    assert _run(svc.a, "ttl").status_code == 200
    before = time.time()
    info = svc.a.get("/v1/sandbox/sessions/tenant-a/ttl").json()
    assert info["state"] == "running" and info["expires_at"] is not None
    assert before + 290 <= info["expires_at"] <= time.time() + 300
    listed = {s["session_id"]: s for s in svc.root.get("/v1/sandbox/sessions").json()["sessions"]}
    assert abs(listed["ttl"]["expires_at"] - info["expires_at"]) < 5


@pytest.mark.parametrize("context", [True, False])
def test_the_timeout_message_says_what_happened(service: Service, context: bool) -> None:
    """A context cell past its timeout is interrupted and keeps its state; "killed" was said either way."""
    extra = {"context_id": "nb"} if context else {}
    sid = f"slow-{context}"
    if context:
        assert _run(service.a, sid, "rows = [1, 2]", **extra).status_code == 200
    r = _run(service.a, sid, "import time; time.sleep(10)", timeout=1, **extra)
    assert r.status_code == 408
    assert (r.headers.get(CREATED) == "true") is not context  # a 408 that made the session says so too
    message = error_of(r)["message"]
    if context:
        assert "interrupted" in message and "keeps its state" in message and "killed" not in message
        assert _run(service.a, sid, "rows", **extra).json()["result"] == [1, 2]
    else:
        assert "killed" in message
    streamed = service.a.post("/v1/sandbox/execute", json={"code": "import time; time.sleep(10)", "timeout": 1,
                                                           "session_id": sid, "stream": True, **extra})
    error_line = streamed.text.split("event: error\ndata: ", 1)[1].splitlines()[0]
    assert ("keeps its state" in error_line) is context


def test_a_streamed_run_honours_create_session_false_before_its_200(service: Service) -> None:
    r = service.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "nostream", "stream": True},
                       headers={"X-Execbox-Create-Session": "false"})
    assert r.status_code == 404 and error_of(r)["details"]["reason"] == "not_created"
    assert service.app.state.services.sessions.registry.get("tenant-a", "nostream") is None
    made = service.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "nostream", "stream": True})
    assert made.status_code == 200 and '"created": true' in made.text  # the result event's metadata.session
