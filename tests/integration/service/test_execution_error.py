"""``error`` in the HTTP API's execution result (the uncaught exception of the user's code) and
the remote SDK's ExecutionResult.error, on a real service (uvicorn + jail); streamed too."""

from __future__ import annotations

import json

from execbox import RemoteSandbox

from .conftest import Service


def test_execute_response_carries_the_error(service: Service) -> None:
    r = service.a.post("/v1/sandbox/execute", json={"code": "def f():\n    return 1 / 0\nf()"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["exit_code"] == 1
    assert (body["error"]["name"], body["error"]["value"]) == ("ZeroDivisionError", "division by zero")
    assert body["error"]["traceback"] == body["stderr"]
    ok = service.a.post("/v1/sandbox/execute", json={"code": "print(1)"}).json()
    assert "error" in ok and ok["error"] is None
    sh = service.a.post("/v1/sandbox/bash", json={"session_id": "err-sh", "command": "exit 3"}).json()
    assert (sh["exit_code"], sh["error"]) == (3, None)


def test_streamed_result_carries_the_error(service: Service) -> None:
    with service.a.stream("POST", "/v1/sandbox/execute", json={"code": "raise KeyError('k')", "stream": True}) as r:
        assert r.status_code == 200
        events, event = [], None
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event == "result":
                events.append(json.loads(line.split(":", 1)[1]))
    assert [(e["error"]["name"], e["error"]["value"]) for e in events] == [("KeyError", "'k'")]


def test_remote_sdk_parses_the_error(service: Service) -> None:
    with RemoteSandbox.create(service.url, service.tenant_a) as sb:
        r = sb.run_code("x = 1\nraise ValueError('bad ' + str(x))", context_id="c")
        assert r.error is not None and (r.error["name"], r.error["value"]) == ("ValueError", "bad 1")
        assert 'File "<cell 1>", line 2' in r.error["traceback"]
        assert sb.run_code("x", context_id="c").error is None
