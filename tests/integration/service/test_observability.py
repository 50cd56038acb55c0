"""Health, readiness, Prometheus metrics, structured execution logs and the audit table."""

from __future__ import annotations

import json
import logging
import time

from prometheus_client.parser import text_string_to_metric_families

from execbox.service.logs import JsonFormatter

from .conftest import Service


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_healthz_and_readyz(service: Service) -> None:
    c = service.client()
    assert c.get("/healthz").json() == {"status": "ok"}
    ready = c.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["provider"] == "jail" and ready.json()["store"] == "ok"


def test_readyz_is_503_with_the_reason_when_the_provider_is_unhealthy(service_factory) -> None:
    from execbox.providers.jail import JailProvider

    sick = JailProvider()  # never initialized: health_check() is False
    svc: Service = service_factory(provider=sick)
    r = svc.client().get("/readyz")
    assert r.status_code == 503
    err = r.json()["error"]
    assert err["code"] == "SB009" and "jail" in err["details"]["reasons"]["provider"]
    assert svc.client().get("/healthz").status_code == 200  # alive, just not ready


def test_readyz_is_503_when_the_store_is_unreachable(service_factory) -> None:
    from sqlalchemy import create_engine

    from execbox.service.store import Store

    svc: Service = service_factory()
    good = svc.app.state.services.store
    # a store whose database does not answer (nothing listens on port 1)
    svc.app.state.services.store = Store(create_engine("postgresql+psycopg://x@127.0.0.1:1/x"), good.data_dir)
    try:
        r = svc.client().get("/readyz")
        assert r.status_code == 503 and "store" in r.json()["error"]["details"]["reasons"]
    finally:
        svc.app.state.services.store = good


def test_metrics_count_executions_durations_sessions_and_errors(service_factory) -> None:
    svc: Service = service_factory(tenant_max_executions=5)
    c = svc.a
    c.post("/v1/sandbox/execute", json={"code": "print(1)", "session_id": "m"})
    c.post("/v1/sandbox/execute", json={"code": "exit 3", "language": "bash", "session_id": "m"})
    c.post("/v1/sandbox/execute", json={"code": "import time; time.sleep(5)", "timeout": 0.3})
    c.post("/v1/sandbox/execute", json={"code": "1", "language": "cobol"})
    c.post("/v1/sandbox/read", json={"session_id": "m", "path": "missing"})
    m = _samples(svc.client().get("/metrics").text)
    ex = "execbox_executions_total"
    assert m[(ex, (("language", "python"), ("provider", "jail"), ("status", "success")))] == 1
    assert m[(ex, (("language", "bash"), ("provider", "jail"), ("status", "failed")))] == 1
    assert m[(ex, (("language", "python"), ("provider", "jail"), ("status", "timeout")))] == 1
    assert m[("execbox_execution_duration_seconds_count", (("language", "python"), ("provider", "jail")))] == 2
    assert m[("execbox_active_sessions", ())] == 1
    assert m[("execbox_errors_total", (("code", "SB002"),))] == 2  # cobol + missing file
    assert m[("execbox_errors_total", (("code", "SB005"),))] == 1
    assert any(k[0] == "execbox_pool_boxes" and dict(k[1])["provider"] == "jail" for k in m)


def test_execution_log_has_the_ragflow_fields_and_never_the_code(service: Service, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="execbox.service.exec"):
        service.a.post("/v1/sandbox/execute", json={"code": "print('TOPSECRET-CODE')", "session_id": "log"})
    [rec] = [r for r in caplog.records if r.name == "execbox.service.exec"]
    line = json.loads(JsonFormatter().format(rec))
    for key in ("timestamp", "tenant_id", "provider", "operation", "instance_id", "language", "code_hash",
                "duration_ms", "status", "exit_code", "memory_used_mb"):
        assert key in line, key
    assert line["tenant_id"] == "tenant-a" and line["provider"] == "jail" and line["status"] == "success"
    assert line["operation"] == "execute_code" and line["code_hash"].startswith("sha256:")
    assert line["exit_code"] == 0 and line["memory_used_mb"] > 0
    assert "TOPSECRET" not in json.dumps(line)


def test_audit_table_records_facts_and_code_only_when_enabled(service_factory) -> None:
    plain: Service = service_factory()
    plain.a.post("/v1/sandbox/bash", json={"command": "echo AUDIT-ME", "session_id": "au"})
    plain.app.state.services.audit.flush()
    [row] = plain.store.audit.list(tenant_id="tenant-a")
    assert row["operation"] == "run_command" and row["language"] == "bash" and row["status"] == "success"
    assert row["provider"] == "jail" and row["exit_code"] == 0 and row["code"] is None
    assert row["session_id"] == "au" and row["token_id"].startswith("tok_")
    assert row["code_hash"].startswith("sha256:")

    full: Service = service_factory(audit_code=True)
    for i in range(3):  # written in batches: every record lands, in order
        full.a.post("/v1/sandbox/bash", json={"command": f"echo AUDIT-ME-{i}", "session_id": "au"})
    full.app.state.services.audit.flush()
    rows = full.store.audit.list(tenant_id="tenant-a")
    assert [r["code"] for r in rows] == ["echo AUDIT-ME-2", "echo AUDIT-ME-1", "echo AUDIT-ME-0"]
    assert rows[0]["created_at"] > rows[2]["created_at"]


def test_settings_from_env_are_strict() -> None:
    import pytest

    from execbox.errors import InvalidConfigError
    from execbox.service.config import ServiceSettings

    s = ServiceSettings.from_env({"SANDBOX_IDLE_TIMEOUT": "15m", "SANDBOX_MAX_SESSIONS": "7",
                                  "SANDBOX_AUDIT_CODE": "true", "SANDBOX_TIMEOUT_SEC": "1m"})
    assert (s.idle_timeout, s.max_sessions, s.audit_code, s.default_timeout) == (900.0, 7, True, 60.0)
    defaults = ServiceSettings.from_env({})
    assert (defaults.idle_timeout, defaults.max_sessions, defaults.tenant_max_executions) == (900.0, 50, 10)
    for env, var in ((({"SANDBOX_MAX_SESSIONS": "lots"}), "SANDBOX_MAX_SESSIONS"),
                     ({"SANDBOX_IDLE_TIMEOUT": "soon"}, "SANDBOX_IDLE_TIMEOUT"),
                     ({"SANDBOX_AUDIT_CODE": "maybe"}, "SANDBOX_AUDIT_CODE"),
                     ({"SANDBOX_MAX_SESSIONS": "0"}, "SANDBOX_MAX_SESSIONS")):
        with pytest.raises(InvalidConfigError) as e:
            ServiceSettings.from_env(env)
        assert e.value.code == "SB002" and e.value.details["field"] == var


def test_readyz_runs_one_probe_for_a_flood_and_names_no_internal_address(service_factory) -> None:
    """/readyz needs no token: a flood of it must not tie up a worker thread each (one provider
    health check answers for READY_TTL), and its answer must not carry the provider's error text
    (it named internal hosts, e.g. the Docker engine's address)."""
    from concurrent.futures import ThreadPoolExecutor

    from execbox.errors import ProviderUnavailableError

    calls: list[float] = []

    class Slow:
        name, initialized = "slowprobe", True

        class isolation:  # noqa: N801 - stands in for the enum
            value = "jail"

        def health_check(self) -> bool:
            calls.append(time.monotonic())
            time.sleep(0.5)
            return True

    class Holder:
        def __init__(self) -> None:
            self.broken = False

        def current(self):
            if self.broken:
                raise ProviderUnavailableError("HTTPConnectionPool(host='10.9.8.7', port=2376): refused")
            return Slow()

        def candidates(self):
            return []

    holder = Holder()
    svc: Service = service_factory(provider=holder)
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda _: svc.client().get("/readyz").status_code, range(32)))
    assert answers == [200] * 32 and len(calls) == 1, (answers, len(calls))
    holder.broken = True
    time.sleep(2.1)  # past the answer's lifetime
    r = svc.client().get("/readyz")
    assert r.status_code == 503 and "10.9.8.7" not in r.text and "SB009" in r.text
