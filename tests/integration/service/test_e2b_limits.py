"""The service's limits hold on the E2B sandbox URL too (a service with small limits, the real
e2b SDK pointed at it): SANDBOX_MAX_REQUEST_BYTES bounds envd/interpreter bodies, streamed or
declared, before they are buffered; SANDBOX_MAX_BACKGROUND_PROCESSES caps a sandbox's processes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

e2b = pytest.importorskip("e2b")

PART = 400 * 1024


def _sandbox(url: str, token: str, monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setenv("E2B_API_URL", url)
    monkeypatch.setenv("E2B_SANDBOX_URL", url)
    monkeypatch.setenv("E2B_API_KEY", token)
    for name in ("E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return e2b.Sandbox.create(timeout=120)


def _multipart(n: int) -> Iterator[bytes]:
    for i in range(n):
        yield (f"--XB\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f{i}.bin\"\r\n"
               f"Content-Type: application/octet-stream\r\n\r\n").encode()
        yield b"A" * PART + b"\r\n"
    yield b"--XB--\r\n"


def test_sandbox_url_bodies_are_bounded_by_max_request_bytes(service_factory, monkeypatch) -> None:
    svc = service_factory(max_request_bytes=1024 * 1024, max_file_bytes=512 * 1024)
    sbx = _sandbox(svc.url, svc.tenant_a, monkeypatch)
    try:
        h = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983",
             "X-Access-Token": sbx._envd_access_token, "Content-Type": "multipart/form-data; boundary=XB"}
        # every part under max_file_bytes, the body (1.6 MiB) over max_request_bytes: streamed ...
        r = httpx.post(f"{svc.url}/files", content=_multipart(4), headers=h, timeout=60)
        assert r.status_code == 413, r.text[:300]
        assert r.json()["error"]["code"] == "SB002" and r.json()["error"]["details"]["limit"] == 1024 * 1024
        # ... or declared
        r = httpx.post(f"{svc.url}/files", content=b"".join(_multipart(4)), headers=h, timeout=60)
        assert r.status_code == 413, r.text[:300]
        assert "f0.bin" not in sbx.commands.run("ls").stdout  # nothing of the refused bodies was written
        big_json = b'{"code": "' + b"#" * (1100 * 1024) + b'"}'
        r = httpx.post(f"{svc.url}/execute", content=big_json,
                       headers={**h, "E2b-Sandbox-Port": "49999", "Content-Type": "application/json"})
        assert r.status_code == 413
        big_stat = b'{"path": "' + b"a" * (1100 * 1024) + b'"}'
        r = httpx.post(f"{svc.url}/filesystem.Filesystem/Stat",  # a Connect call, its body streamed
                       content=(big_stat[i:i + 65536] for i in range(0, len(big_stat), 65536)),
                       headers={**h, "Content-Type": "application/json"})
        assert r.json()["code"] == "resource_exhausted" and "SB002" in r.json()["message"], r.text[:300]
        # under the limit: a multi-file upload is written, file by file
        r = httpx.post(f"{svc.url}/files", content=b"".join(_multipart(2)), headers=h, timeout=60)
        assert r.status_code == 200, r.text[:300]
        assert [f["name"] for f in r.json()] == ["f0.bin", "f1.bin"]
        assert len(sbx.files.read("f1.bin", format="bytes")) == PART
        assert sbx.commands.run("echo ok").stdout == "ok\n"  # the server is fine
    finally:
        sbx.kill()


def test_background_processes_per_sandbox_are_capped(service_factory, monkeypatch) -> None:
    svc = service_factory(max_background_processes=3)
    sbx = _sandbox(svc.url, svc.tenant_a, monkeypatch)
    try:
        handles = [sbx.commands.run("sleep 60", background=True, timeout=0) for _ in range(3)]
        with pytest.raises(e2b.RateLimitException, match="SANDBOX_MAX_BACKGROUND_PROCESSES"):
            sbx.commands.run("sleep 60", background=True, timeout=0)
        with pytest.raises(e2b.RateLimitException):  # a foreground command is a process too
            sbx.commands.run("echo hi")
        handles[0].kill()
        deadline = time.monotonic() + 10
        while len(sbx.commands.list()) > 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sbx.commands.run("echo room").stdout == "room\n"  # a slot is free again
        for h in handles[1:]:
            h.kill()
    finally:
        sbx.kill()
