"""File operations take the run path: they count in metrics, land in the audit log and obey quotas."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from .conftest import Service, error_of, slots_taken


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_a_file_write_shows_in_metrics_and_the_audit_log(service_factory) -> None:
    svc: Service = service_factory(audit_code=True)
    c = svc.a
    assert c.post("/v1/sandbox/write", json={"session_id": "fa", "path": "notes/a.txt",
                                             "content": "hello"}).status_code == 200
    assert c.post("/v1/sandbox/read", json={"session_id": "fa", "path": "notes/a.txt"}).json()["content"]
    assert c.post("/v1/sandbox/read", json={"session_id": "fa", "path": "missing.txt"}).status_code == 404
    m = _samples(svc.client().get("/metrics").text)
    fo = "execbox_file_operations_total"
    assert m[(fo, (("operation", "write_file"), ("status", "success")))] == 1
    assert m[(fo, (("operation", "read_file"), ("status", "success")))] == 1
    assert m[(fo, (("operation", "read_file"), ("status", "error")))] == 1
    ex = (("language", "files"), ("provider", "jail"), ("status", "success"))
    assert m[("execbox_executions_total", ex)] == 2
    svc.app.state.services.audit.flush()
    rows = svc.store.audit.list(tenant_id="tenant-a")
    assert [(r["operation"], r["status"], r["code"], r["error_code"]) for r in rows] == [
        ("read_file", "error", "missing.txt", "SB002"),
        ("read_file", "success", "notes/a.txt", None),
        ("write_file", "success", "notes/a.txt", None)]
    assert all(r["session_id"] == "fa" and r["token_id"].startswith("tok_") for r in rows)
    assert all(r["provider"] == "jail" and r["instance_id"] for r in rows)


def test_a_file_write_over_the_tenant_quota_is_refused_and_nothing_is_written(service_factory) -> None:
    svc: Service = service_factory(tenant_max_executions=1)
    c = svc.a
    c.post("/v1/sandbox/write", json={"session_id": "fq", "path": "keep.txt", "content": "v1"})
    with slots_taken(svc.app.state.services.sessions, "tenant-a"):  # its one slot: a run in progress
        r = c.post("/v1/sandbox/write", json={"session_id": "fq", "path": "keep.txt", "content": "v2"})
        assert r.status_code == 429
        err = error_of(r)
        assert err["code"] == "SB008" and err["details"]["reason"] == "tenant_max_executions"
        r = c.post("/v1/sandbox/sessions/tenant-a/fq/copy", json={"files": [{"path": "x.txt", "content": "x"}]})
        assert error_of(r)["code"] == "SB008"
        # another tenant's quota is its own
        assert svc.b.post("/v1/sandbox/write", json={"session_id": "fq", "path": "b.txt",
                                                     "content": "b"}).status_code == 200
    assert c.post("/v1/sandbox/read", json={"session_id": "fq", "path": "keep.txt"}).json()["content"] == "v1"
    assert c.post("/v1/sandbox/glob", json={"session_id": "fq", "pattern": "x.txt"}).json()["paths"] == []
    m = _samples(svc.client().get("/metrics").text)
    assert m[("execbox_rate_limit_rejections_total", (("limit", "executions"),))] == 2
    assert m[("execbox_file_operations_total", (("operation", "write_file"), ("status", "error")))] == 1
