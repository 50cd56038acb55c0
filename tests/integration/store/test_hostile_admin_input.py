"""Review 47, on SQLite and PostgreSQL: hostile admin input is a 400 naming the field, never a
500 (F1); a NUL (or a lone surrogate) in what a tenant submits never costs an audit row, and a
failing statement never puts its values in the log (F2); tokens show ``ebx_`` + last 4 only (F4);
provider secrets that cannot be header values are refused and nothing is activated (F5)."""

from __future__ import annotations

import json
import logging

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert, select, text

from execbox.egress.audit import AuditRecord
from execbox.service.app import create_app
from execbox.service.config import ServiceSettings
from execbox.service.logs import AuditWriter
from execbox.service.provider_manager import ProviderManager
from execbox.service.store import open_store
from execbox.service.store import repos as repos_module
from execbox.service.store.egress_store import EgressAuditEntry, EgressAuditRepo
from execbox.service.store.models import AuditEntry, Token

from .helpers import keyring, write_seed

MARKER = "MARKER-9f3e1c-code-never-logged"


@pytest.fixture
def admin(db_url, tmp_path):  # noqa: ANN001, ANN201
    store = open_store(tmp_path, url=db_url)
    providers = ProviderManager(store, keyring=keyring(), env={"SANDBOX_TYPE": "local"},
                                seed_file=write_seed(tmp_path))
    app = create_app(store=store, providers=providers, settings=ServiceSettings(audit_code=True))
    _, admin_token = store.tokens.create("ops", "admin")
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {admin_token}"
        client.store = store
        yield client
    providers.shutdown()
    store.close()


def _field(r) -> str:  # noqa: ANN001
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "SB002"
    return r.json()["error"]["details"]["field"]


# -- F1 --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "params", "field"), [
    ("/api/admin/sandbox/audit", {"before_id": str(10**20)}, "before_id"),
    ("/api/admin/sandbox/audit", {"before_id": str(2**63)}, "before_id"),
    ("/api/admin/sandbox/audit/9223372036854775808", {}, "entry_id"),
    ("/api/admin/sandbox/audit/0", {}, "entry_id"),
    ("/api/admin/sandbox/audit", {"tenant_id": "\x00"}, "tenant_id"),
    ("/api/admin/sandbox/audit", {"tenant_id": "a" * 65}, "tenant_id"),
    ("/api/admin/egress/audit", {"tenant_id": "\x00"}, "tenant_id"),
    ("/api/admin/egress/audit", {"session_id": "\x00"}, "session_id"),
    ("/api/admin/egress/audit", {"session_id": "a/b"}, "session_id"),
])
def test_out_of_range_ids_and_nul_filters_are_400_naming_the_field(admin, path, params, field) -> None:  # noqa: ANN001
    assert _field(admin.get(path, params=params)) == field


def test_the_largest_id_and_plain_filters_still_work(admin) -> None:  # noqa: ANN001
    admin.store.audit.record(tenant_id="acme", session_id="s1", operation="execute")
    assert admin.get("/api/admin/sandbox/audit", params={"before_id": 2**63 - 1, "tenant_id": "acme"}
                     ).json()["data"][0]["session_id"] == "s1"
    r = admin.get(f"/api/admin/sandbox/audit/{2**63 - 1}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "SB002"
    r = admin.get("/api/admin/egress/audit", params={"tenant_id": "", "session_id": "s1"})  # empty: no filter
    assert r.status_code == 200 and r.json()["data"] == []


@pytest.mark.parametrize("name", ["a\x00b", "line\nbreak", "bell\x07", "del\x7f", "c1\x85"])
def test_token_names_with_control_characters_are_refused(admin, name) -> None:  # noqa: ANN001
    before = len(admin.store.tokens.list())
    r = admin.post("/api/admin/tokens", json={"tenant_id": "nul", "name": name})
    assert _field(r) == "name" and "control characters" in r.json()["error"]["message"]
    assert len(admin.store.tokens.list()) == before  # nothing stored, on either database
    r = admin.post("/api/admin/tokens", json={"tenant_id": "nul", "name": "ünïcode name · ok"})
    assert r.status_code == 201 and r.json()["token"]["name"] == "ünïcode name · ok"


# -- F2 --------------------------------------------------------------------------------------------

def _rows(store) -> list[dict]:  # noqa: ANN001
    return store.audit.list(limit=100)


def test_nul_and_surrogates_in_submitted_code_still_leave_an_audit_row(admin) -> None:  # noqa: ANN001
    store = admin.store
    writer = AuditWriter(store)
    try:
        writer.submit({"tenant_id": "acme", "operation": "execute_code", "language": "javascript",
                       "code": "// \x00 hidden\nconsole.log('ran')", "code_hash": "sha256:1", "status": "success"})
        writer.submit({"tenant_id": "acme", "operation": "run_command", "language": "bash\x00",
                       "code": "echo \ud800 lone", "code_hash": "sha256:2", "status": "success"})
        writer.submit({"tenant_id": "acme", "operation": "execute_code", "code": "print(1)",
                       "code_hash": "sha256:3", "status": "success"})
        assert writer.flush()
    finally:
        writer.close()
    rows = {r["code_hash"]: r for r in _rows(store)}
    assert set(rows) == {"sha256:1", "sha256:2", "sha256:3"}  # none lost, the clean one neither
    assert rows["sha256:1"]["code"] == "// \\x00 hidden\nconsole.log('ran')"  # escaped, documented
    assert rows["sha256:2"]["code"] == "echo \\ud800 lone" and rows["sha256:2"]["language"] == "bash\\x00"
    store.audit.record(tenant_id="acme", operation="execute", code="x\x00y")  # the one-row path too
    assert _rows(store)[0]["code"] == "x\\x00y" and _rows(store)[0]["code_hash"].startswith("sha256:")


def test_a_row_that_still_fails_is_written_without_its_code_and_logs_no_code(admin, monkeypatch,  # noqa: ANN001
                                                                             caplog) -> None:
    """Whatever else makes a row with its code fail (here: a NOT NULL violation, whose PostgreSQL
    DETAIL quotes the whole row): the row (tenant, token, hash, status) is kept, and no log line
    carries the code (no parameter list, no DETAIL)."""
    real = repos_module.audit_row

    def sabotage(fields: dict) -> dict:
        row = real(fields)
        return {**row, "tenant_id": None} if row.get("code") is not None else row

    monkeypatch.setattr(repos_module, "audit_row", sabotage)
    writer = AuditWriter(admin.store)
    try:
        with caplog.at_level(logging.DEBUG):
            writer.submit({"tenant_id": "acme", "operation": "execute_code", "code": MARKER,
                           "code_hash": "sha256:kept", "token_id": "tok_1", "status": "success"})
            assert writer.flush()
    finally:
        writer.close()
    row = _rows(admin.store)[0]
    assert (row["tenant_id"], row["code_hash"], row["token_id"], row["status"], row["code"]) == (
        "acme", "sha256:kept", "tok_1", "success", None)
    assert "without its code" in caplog.text and MARKER not in caplog.text


def test_a_failing_statement_hides_its_parameters(admin) -> None:  # noqa: ANN001
    """hide_parameters on the store's engines: SQLAlchemy's error text carries no parameter list."""
    with pytest.raises(Exception) as failed:  # noqa: PT011 - IntegrityError on both databases
        with admin.store.engine.begin() as conn:
            conn.execute(insert(AuditEntry).values(tenant_id=None, operation="x", created_at=1.0, code=MARKER))
    assert "parameters hidden" in str(failed.value) and "[parameters:" not in str(failed.value)


def test_nul_in_a_dns_host_name_costs_no_egress_audit_record(admin) -> None:  # noqa: ANN001
    from sqlalchemy.orm import sessionmaker

    repo = EgressAuditRepo(sessionmaker(admin.store.engine))
    records = [AuditRecord(box="b", kind="dns", host=h, ip=None, port=53, tenant_id="acme", session_id="s1")
               for h in ("x\x00y.example", "ok.example", "\ud800.example")]
    repo.insert_many(records)
    with admin.store.engine.connect() as conn:
        hosts = sorted(conn.execute(select(EgressAuditEntry.host)).scalars())
    assert hosts == ["\\ud800.example", "ok.example", "x\\x00y.example"]


def test_interrupted_runs_with_nul_in_their_code_are_recovered(admin) -> None:  # noqa: ANN001
    from execbox.service.store import audit_inflight

    record = {"tenant_id": "acme", "operation": "execute_code", "code": "a\x00b", "code_hash": "sha256:i",
              "created_at": 5.0}
    with admin.store.engine.begin() as conn:
        audit_inflight.apply(conn, [{"key": "k" * 32, "replica": "gone", "record": record}], [])
    assert audit_inflight.recover(admin.store.engine, "gone") == 1
    row = _rows(admin.store)[0]
    assert (row["status"], row["code"]) == ("interrupted", "a\\x00b")


# -- F4 --------------------------------------------------------------------------------------------

def test_tokens_show_the_tag_and_last_4_only(admin) -> None:  # noqa: ANN001
    made = admin.post("/api/admin/tokens", json={"tenant_id": "acme", "name": "t"}).json()
    secret = made["secret"]
    assert made["token"]["token"] == f"ebx_...{secret[-4:]}"
    listed = {t["id"]: t["token"] for t in admin.get("/api/admin/tokens").json()["tokens"]}
    assert listed[made["token"]["id"]] == f"ebx_...{secret[-4:]}"
    with admin.store.engine.begin() as conn:  # a row made before the fix keeps 4 random characters
        conn.execute(Token.__table__.update().where(Token.id == made["token"]["id"]).values(prefix=secret[:8]))
    listed = {t["id"]: t["token"] for t in admin.get("/api/admin/tokens").json()["tokens"]}
    assert listed[made["token"]["id"]] == f"ebx_...{secret[-4:]}"
    with admin.store.engine.connect() as conn:
        fresh = admin.store.tokens.create("acme")[0]
        assert conn.execute(text("SELECT prefix FROM tokens WHERE id = :i"), {"i": fresh.id}).scalar() == "ebx_"


# -- F5 --------------------------------------------------------------------------------------------

BAD_SECRETS = ["SECRETKEY0123456789\n", "SECRET\rKEY0123456789", "SECRET\x00KEY0123456789", "SECRETKEY0123456789é"]


@pytest.mark.parametrize("secret", BAD_SECRETS)
def test_secrets_that_cannot_be_header_values_are_refused_and_nothing_is_activated(admin, secret) -> None:  # noqa: ANN001
    before = admin.get("/api/admin/sandbox/config").json()
    r = admin.post("/api/admin/sandbox/config", json={
        "provider_type": "self_managed", "set_active": True,
        "config": {"endpoint": "http://127.0.0.1:9", "api_key": secret}})
    assert r.status_code == 400 and r.json()["error"]["code"] == "SB002", r.text
    assert set(r.json()["error"]["details"]["fields"]) == {"api_key"}
    assert secret not in r.text and secret.strip() not in r.text and "0123456789" not in r.text  # never echoed
    after = admin.get("/api/admin/sandbox/config").json()
    assert after["active"] == before["active"] and after["self_managed"] == before["self_managed"]
    assert admin.post("/api/admin/sandbox/test", json={
        "provider_type": "self_managed", "config": {"endpoint": "http://127.0.0.1:9", "api_key": secret}}
    ).status_code == 400


def test_a_stored_secret_saved_before_the_check_cannot_be_activated(admin) -> None:  # noqa: ANN001
    r = admin.post("/api/admin/sandbox/config", json={
        "provider_type": "self_managed", "set_active": False,
        "config": {"endpoint": "http://127.0.0.1:9", "api_key": "SECRETKEY0123456789"}})
    assert r.status_code == 200, r.text
    settings = admin.app.state.services.sandbox_settings
    settings.save("self_managed", {"endpoint": "http://127.0.0.1:9", "api_key": "SECRETKEY0123456789\n"})
    r = admin.put("/api/admin/sandbox/active", json={"provider": "self_managed"})
    assert r.status_code == 409, r.text
    assert "api_key" in r.json()["error"]["details"]["config_errors"] and "0123456789" not in r.text
    assert admin.get("/api/admin/sandbox/config").json()["active"] != "self_managed"


def test_a_good_secret_still_saves_and_activates(admin) -> None:  # noqa: ANN001
    r = admin.post("/api/admin/sandbox/config", json={
        "provider_type": "self_managed", "set_active": True,
        "config": {"endpoint": "http://127.0.0.1:9", "api_key": "SECRET KEY-0123456789_~!"}})
    assert r.status_code == 200 and r.json()["active"] is True, r.text
    assert json.dumps(r.json()).count("0123456789") == 0
