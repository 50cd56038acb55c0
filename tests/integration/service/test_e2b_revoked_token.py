"""Revoking the execbox token that created an E2B sandbox ends the sandbox: its URL (interpreter,
envd files, Connect services) answers 401 in E2B's error shape, and the sweeper kills it, while
a sandbox of a still-valid token of the same tenant goes on."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from execbox.service.e2b_compat import creator


@pytest.fixture
def svc(service_factory, monkeypatch: pytest.MonkeyPatch) -> Any:  # noqa: ANN001
    monkeypatch.setattr(creator, "CREATOR_CHECK_TTL", 0.2)  # the cache must not hide the revocation long
    return service_factory()


def _create(url: str, key: str) -> tuple[str, dict[str, str]]:
    r = httpx.post(f"{url}/sandboxes", headers={"X-API-Key": key},
                   json={"templateID": "base", "timeout": 86400}, timeout=60)
    assert r.status_code == 201, r.text
    body = r.json()
    return body["sandboxID"], {"E2b-Sandbox-Id": body["sandboxID"], "X-Access-Token": body["envdAccessToken"]}


def _execute(url: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{url}/execute", headers={**headers, "E2b-Sandbox-Port": "49999"},
                      json={"code": "print('still running')"}, timeout=60)


def test_revoked_creator_token_ends_its_sandbox(svc) -> None:  # noqa: ANN001
    doomed_rec, doomed_key = svc.store.tokens.create("tenant-a", name="to revoke")
    sid, headers = _create(svc.url, doomed_key)
    other_sid, other_headers = _create(svc.url, svc.tenant_a)  # same tenant, a token that stays valid
    r = _execute(svc.url, headers)
    assert r.status_code == 200 and "still running" in r.text

    # The sweeper would kill the sandbox within a second of the revocation, and a killed sandbox
    # answers 502 "not found"; it waits here until the URL's own refusal has been seen.
    registry = svc.app.state.services.e2b
    sweep_revoked = registry._kill_of_revoked_tokens
    held = threading.Event()
    held.set()
    registry._kill_of_revoked_tokens = lambda: None if held.is_set() else sweep_revoked()

    assert svc.root.delete(f"/api/admin/tokens/{doomed_rec.id}").status_code in (200, 204)
    time.sleep(0.3)  # past the (shortened) validity cache

    r = _execute(svc.url, headers)
    assert r.status_code == 401, r.text[:300]
    assert r.json()["code"] == 401 and "revoked" in r.json()["message"] and "still running" not in r.text
    r = httpx.get(f"{svc.url}/files", params={"path": "x"}, headers={**headers, "E2b-Sandbox-Port": "49983"})
    assert r.status_code == 401
    r = httpx.post(f"{svc.url}/process.Process/List", json={},
                   headers={**headers, "E2b-Sandbox-Port": "49983", "Content-Type": "application/json"})
    assert r.status_code == 401

    held.clear()
    sessions = svc.app.state.services.sessions
    deadline = time.monotonic() + 15
    while (registry.get(sid) is not None or sessions.get("tenant-a", f"e2b-{sid}") is not None) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert registry.get(sid) is None and sessions.get("tenant-a", f"e2b-{sid}") is None  # killed

    listed = httpx.get(f"{svc.url}/sandboxes", headers={"X-API-Key": svc.tenant_a}).json()
    assert [s["sandboxID"] for s in listed] == [other_sid]
    r = _execute(svc.url, other_headers)
    assert r.status_code == 200 and "still running" in r.text
    httpx.delete(f"{svc.url}/sandboxes/{other_sid}", headers={"X-API-Key": svc.tenant_a})
