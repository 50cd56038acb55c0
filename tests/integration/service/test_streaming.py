"""SSE on a real service: event order, errors as events, and a disconnect stopping the run."""

from __future__ import annotations

import time

import httpx

from execbox.sdk.wire import iter_events

from .conftest import Service


def _events(client: httpx.Client, path: str, body: dict, **headers: str) -> list[tuple[str, dict]]:
    with client.stream("POST", path, json=body, headers=headers) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return list(iter_events(r.iter_lines()))


def test_events_arrive_in_order_stdout_stderr_artifact_result(service: Service) -> None:
    code = ("import os, sys, time\nprint('one', flush=True)\ntime.sleep(0.2)\n"
            "print('two', file=sys.stderr, flush=True)\nos.makedirs('artifacts', exist_ok=True)\n"
            "open('artifacts/out.txt', 'w').write('data')\nprint('three', flush=True)")
    events = _events(service.a, "/v1/sandbox/execute", {"code": code, "session_id": "sse"},
                     accept="text/event-stream")
    names = [e for e, _ in events]
    assert names == ["stdout", "stderr", "stdout", "artifact", "result"], events
    assert [d["text"] for e, d in events if e in ("stdout", "stderr")] == ["one\n", "two\n", "three\n"]
    art = events[3][1]
    assert art["name"] == "out.txt" and art["size"] == 4 and art["url"] == "/v1/sandbox/read_binary"
    fetched = service.a.post(art["fetch"]["url"], json=art["fetch"]["json"]).json()
    assert fetched["sha256"] == art["sha256"]
    result = events[-1][1]
    assert result["stdout"] == "one\nthree\n" and result["stderr"] == "two\n" and result["exit_code"] == 0


def test_stream_flag_bash_and_bare_path(service: Service) -> None:
    events = _events(service.a, "/bash", {"command": "echo hi; echo oops >&2; exit 4", "stream": True})
    assert [e for e, _ in events] in (["stdout", "stderr", "result"], ["stderr", "stdout", "result"])
    assert events[-1][1]["exit_code"] == 4
    art_url = _events(service.a, "/execute", {
        "code": "import os\nos.makedirs('artifacts', exist_ok=True)\nopen('artifacts/a','w').write('1')",
        "session_id": "sse", "stream": True})[0][1]["url"]
    assert art_url == "/read_binary"


def test_one_shot_stream_carries_artifact_bytes(service: Service) -> None:
    events = _events(service.a, "/v1/sandbox/execute", {
        "code": "import os\nos.makedirs('artifacts', exist_ok=True)\nopen('artifacts/a.txt','w').write('AB')",
        "stream": True})
    art = dict(events)["artifact"]
    assert art["content_b64"] == "QUI=" and "url" not in art


def test_timeout_streams_result_then_error(service: Service) -> None:
    events = _events(service.a, "/v1/sandbox/execute", {
        "code": "import time\nprint('start', flush=True)\ntime.sleep(30)", "timeout": 0.5, "stream": True})
    assert [e for e, _ in events] == ["stdout", "result", "error"]
    assert events[1][1]["timed_out"] and events[2][1]["code"] == "SB005"


def test_sb_errors_before_the_run_are_error_events_or_statuses(service: Service) -> None:
    r = service.a.post("/v1/sandbox/execute", json={"code": "1", "language": "cobol", "stream": True})
    assert r.status_code == 400  # validated before the stream starts: a real status
    service.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "sse-dead"})
    s = service.app.state.services.sessions.get("tenant-a", "sse-dead")
    s.provider._instances[s.instance_id].box.kill()
    events = _events(service.a, "/v1/sandbox/execute", {"code": "1", "stream": True, "session_id": "sse-dead"})
    assert [e for e, _ in events] == ["error"] and events[0][1]["code"] == "SB009"


def test_client_disconnect_stops_the_run(service: Service) -> None:
    code = ("import time\nn = 0\nwhile True:\n    n += 1\n    open('beat', 'w').write(str(n))\n"
            "    print(n, flush=True)\n    time.sleep(0.05)")
    with service.a.stream("POST", "/v1/sandbox/execute",
                          json={"code": code, "session_id": "dc", "stream": True, "timeout": 60}) as r:
        lines = r.iter_lines()
        seen = 0
        for line in lines:
            if line.startswith("event: stdout"):
                seen += 1
            if seen >= 3:
                break
    # connection closed mid-run: the service must cancel it (well before the 60 s timeout)
    started = time.monotonic()
    r = service.a.post("/v1/sandbox/execute", json={"code": "print(open('beat').read())", "session_id": "dc"},
                       timeout=30)
    waited = time.monotonic() - started
    assert r.status_code == 200 and waited < 10, (r.text, waited)
    beat = int(r.json()["stdout"])
    time.sleep(0.5)
    again = service.a.post("/v1/sandbox/execute", json={"code": "print(open('beat').read())",
                                                        "session_id": "dc"}).json()
    assert int(again["stdout"]) == beat  # nothing is still writing: the run was killed
    stats = service.client().get("/metrics").text
    assert 'execbox_executions_total{language="python",provider="jail",status="cancelled"} 1.0' in stats


def test_disconnect_while_queued_cancels_only_its_own_run(service: Service) -> None:
    import threading

    out: dict = {}
    first = threading.Thread(target=lambda: out.update(a=service.a.post("/v1/sandbox/execute", json={
        "code": "import time\ntime.sleep(1.5)\nprint('A done')", "session_id": "queue"}).json()))
    first.start()
    time.sleep(0.3)  # A holds the session; B queues behind it and its client leaves
    with service.a.stream("POST", "/v1/sandbox/execute", json={
            "code": "open('b-ran', 'w').write('1')", "session_id": "queue", "stream": True}) as r:
        next(r.iter_lines())
    first.join()
    assert out["a"]["stdout"] == "A done\n" and out["a"]["exit_code"] == 0  # A was not cancelled
    after = service.a.post("/v1/sandbox/execute", json={"code": "import os; print(os.path.exists('b-ran'))",
                                                        "session_id": "queue"}).json()
    assert after["stdout"] == "False\n"  # B never started: its client had gone
