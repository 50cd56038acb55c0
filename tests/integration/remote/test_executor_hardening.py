"""`execbox executor` as its own process: the open /run answers programs, not web pages (JSON only,
no foreign Origin, allowed Host), RAGFlow's client shape keeps working, a chunked body is refused
while streaming, and deeply nested JSON is a 422."""

from __future__ import annotations

import base64
import json
import os
import signal
from collections.abc import Iterator

import httpx
import pytest

from .conftest import free_port, start_executor_process, wait_healthy


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture(scope="module")
def executor() -> Iterator[str]:
    port = free_port()
    proc = start_executor_process(port, "--allowed-host", "sandbox-executor-manager", provider="local")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def test_ragflow_client_shape_still_runs(executor: str) -> None:
    """RAGFlow's executor client: requests.post(url + "/run", json=...) - JSON, no Origin, no token."""
    body = {"code_b64": b64("def main(x):\n    return x * 2\n"), "language": "python", "arguments": {"x": 21}}
    r = httpx.post(f"{executor}/run", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["result"]["value"] == 42, r.text
    port = executor.rsplit(":", 1)[1]
    named = httpx.post(f"{executor}/run", json=body, timeout=60,
                       headers={"Host": f"sandbox-executor-manager:{port}"})  # --allowed-host
    assert named.status_code == 200, named.text


def test_open_run_refuses_browser_shaped_requests(executor: str, tmp_path) -> None:
    marker = tmp_path / "ran"
    raw = json.dumps({"code_b64": b64(f"open({str(marker)!r}, 'w').write('x')\n")})
    cases = [({"content-type": "text/plain"}, 415, "Content-Type"),
             ({"content-type": "application/json", "origin": "http://127.0.0.2:18733"}, 403, "Origin"),
             ({"content-type": "application/json", "host": "rebound.example"}, 400, "Host")]
    for headers, status, header in cases:
        r = httpx.post(f"{executor}/run", content=raw, headers=headers, timeout=60)
        assert r.status_code == status, (headers, r.text)
        body = r.json()
        assert body["status"] == "program_runner_error" and body["error"]["code"] == "SB002"
        assert body["error"]["details"]["header"] == header
    assert not marker.exists()


def test_chunked_body_is_refused_while_streaming(executor: str) -> None:
    """No Content-Length: the executor stops at its 32 MiB limit; before, it buffered all of it."""
    offered = 256
    sent = {"mib": 0}

    def body() -> Iterator[bytes]:
        yield b'{"code_b64":"'
        chunk = b"A" * (1 << 20)
        for _ in range(offered):
            sent["mib"] += 1
            yield chunk
        yield b'"}'

    try:
        r = httpx.post(f"{executor}/run", content=body(), headers={"content-type": "application/json"},
                       timeout=120)
        assert r.status_code == 413, r.text[:300]
        assert r.json()["error"]["code"] == "SB002"
    except httpx.TransportError:
        pass  # the server closed the connection after its 413, mid-upload: also a refusal
    assert sent["mib"] < offered, "the whole body was read"
    assert httpx.get(f"{executor}/healthz", timeout=10).status_code == 200


def test_deeply_nested_json_is_422(executor: str) -> None:
    r = httpx.post(f"{executor}/run", content="[" * 100_000 + "]" * 100_000,
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 422, r.text[:300]
    assert r.json()["detail"][0]["type"] == "json_invalid"


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_over_32_mib_is_a_413_in_the_run_shape(executor: str, declared: bool) -> None:
    """docs/executor-api.md: 413 in the /run shape (status program_runner_error, SB002), as
    `execbox serve`'s /run answers it; the standalone executor's body limit answered the generic
    {"error": ...} shape when the length was declared (review 28)."""
    size = 33 * 1024 * 1024
    raw = b'{"code_b64":"' + b"A" * size + b'"}'
    content = raw if declared else iter([raw[i:i + (1 << 20)] for i in range(0, len(raw), 1 << 20)])
    try:
        r = httpx.post(f"{executor}/run", content=content, headers={"content-type": "application/json"},
                       timeout=120)
    except httpx.TransportError:
        pytest.fail("the executor closed the connection instead of answering 413")
    assert r.status_code == 413, r.text[:300]
    body = r.json()
    assert body["status"] == "program_runner_error" and body["exit_code"] == -999, body
    assert body["error"]["code"] == "SB002" and body["error"]["details"]["limit"] == 32 * 1024 * 1024
    assert "33554432" in body["detail"]
    assert r.headers.get("connection") == "close"
