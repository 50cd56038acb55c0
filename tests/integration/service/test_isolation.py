"""Tenant isolation, attacked: tenant A tries every way to see or touch tenant B's sessions and files."""

from __future__ import annotations

import pytest

from .conftest import Service, error_of


@pytest.fixture(scope="module")
def b_secret(service: Service) -> str:
    r = service.b.post("/v1/sandbox/write", json={"session_id": "vault", "path": "secret.txt",
                                                  "content": "B-ONLY-7f3a"})
    assert r.status_code == 200
    return "B-ONLY-7f3a"


@pytest.mark.parametrize("path, body", [
    ("execute", {"code": "print(open('secret.txt').read())"}),
    ("bash", {"command": "cat secret.txt"}),
    ("read", {"path": "secret.txt"}),
    ("read_binary", {"path": "secret.txt"}),
    ("write", {"path": "secret.txt", "content": "pwned"}),
    ("grep", {"pattern": "B-ONLY"}),
    ("glob", {"pattern": "*"}),
    ("list", {"path": "."}),
])
def test_naming_another_tenant_is_403(service: Service, b_secret: str, path: str, body: dict) -> None:
    r = service.a.post(f"/v1/sandbox/{path}", json={**body, "tenant_id": "tenant-b", "session_id": "vault"})
    assert r.status_code == 403, r.text
    assert error_of(r)["details"]["field"] == "tenant_id" and b_secret not in r.text


def test_copy_into_another_tenant_is_403(service: Service, b_secret: str) -> None:
    r = service.a.post("/v1/sandbox/sessions/tenant-b/vault/copy",
                       json={"files": [{"path": "secret.txt", "content": "pwned"}]})
    assert r.status_code == 403
    page = service.b.post("/v1/sandbox/read", json={"session_id": "vault", "path": "secret.txt"}).json()
    assert page["content"] == b_secret


def test_same_session_id_is_a_different_workspace_per_tenant(service: Service, b_secret: str) -> None:
    r = service.a.post("/v1/sandbox/read", json={"session_id": "vault", "path": "secret.txt"})
    assert r.status_code == 404 and b_secret not in r.text
    paths = service.a.post("/v1/sandbox/glob", json={"session_id": "vault", "pattern": "**"}).json()["paths"]
    assert "secret.txt" not in paths


def test_tenant_cannot_list_or_destroy_sessions(service: Service, b_secret: str) -> None:
    assert service.a.get("/v1/sandbox/sessions").status_code == 403
    assert service.a.get("/sessions", params={"tenant_id": "tenant-b"}).status_code == 403
    r = service.a.delete("/v1/sandbox/sessions/tenant-b/vault")
    assert r.status_code == 403
    r = service.a.delete("/v1/sandbox/sessions/tenant-a/vault")  # even its own: admin only
    assert r.status_code == 403
    assert service.app.state.services.sessions.get("tenant-b", "vault") is not None


def test_code_in_a_box_cannot_reach_other_workspaces(service: Service, b_secret: str) -> None:
    """From inside tenant A's box, search the whole visible filesystem for B's secret."""
    host_ws = service.app.state.services.sessions.get("tenant-b", "vault").workspace
    code = f"""
import os
hits = []
for root in ({host_ws!r}, {service.workspaces!r}, '/'):
    try:
        os.listdir(root)
    except OSError:
        continue
for dirpath, dirs, files in os.walk('/', onerror=lambda e: None):
    if dirpath.startswith(('/proc', '/sys', '/dev', '/usr', '/lib', '/bin', '/sbin')):  # read-only system
        dirs[:] = []
        continue
    for f in files:
        p = os.path.join(dirpath, f)
        try:
            with open(p, 'rb') as fh:
                if b'B-ONLY-7f3a' in fh.read(1 << 20):
                    hits.append(p)
        except OSError:
            pass
print(os.path.exists({host_ws!r}), hits)
"""
    r = service.a.post("/v1/sandbox/execute", json={"code": code, "session_id": "attacker", "timeout": 60})
    assert r.status_code == 200, r.text
    assert r.json()["stdout"] == "False []\n"


def test_admin_may_act_for_any_tenant(service: Service, b_secret: str) -> None:
    r = service.root.post("/v1/sandbox/read", json={"tenant_id": "tenant-b", "session_id": "vault",
                                                    "path": "secret.txt"})
    assert r.status_code == 200 and r.json()["content"] == b_secret
