"""CLI answers an operator gets when something is misconfigured (review 50): non-finite numbers
(F2), tenant ids the service would refuse (F7), exit codes of doctor (F10), secrets status (F12)
and config show (F13), option values (F11), and session calls to something that is not execbox
(F13)."""

from __future__ import annotations

import base64
import json
import math
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from execbox.cli import app
from execbox.errors import InvalidConfigError
from execbox.providers.schema import check_config, validate_against_schema
from execbox.service.store import open_store


@pytest.fixture
def cli(tmp_path, monkeypatch):
    for var in ("SANDBOX_TYPE", "SANDBOX_BACKEND", "EXECBOX_DATABASE_URL", "EXECBOX_SECRET_KEY",
                "EXECBOX_SECRET_KEY_PREVIOUS", "SANDBOX_TIMEOUT_SEC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("EXECBOX_DATA_DIR", str(tmp_path))
    runner = CliRunner()

    def invoke(*args: str, env: dict[str, str] | None = None):
        return runner.invoke(app, list(args), env=env)

    invoke.data_dir = tmp_path
    return invoke


def _no_traceback(r) -> None:
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "nan", "NaN", "inf", "-Infinity"])
@pytest.mark.parametrize("spec", [{"type": "number"}, {"type": "number", "min": 0, "max": 64}])
def test_a_number_field_refuses_non_finite_values(value, spec) -> None:
    clean, errors = validate_against_schema({"cpus": spec}, {"cpus": value})
    assert errors == {"cpus": "must be a finite number"} and "cpus" not in clean
    with pytest.raises(InvalidConfigError, match="cpus: must be a finite number"):
        check_config({"cpus": spec}, {"cpus": value}, "jail")
    assert validate_against_schema({"cpus": spec}, {"cpus": "1.5"}) == ({"cpus": 1.5}, {})


def test_config_set_refuses_nan_and_stores_nothing(cli) -> None:
    r = cli("config", "set", "jail", "cpus=nan", "--activate")
    assert r.exit_code == 2 and "cpus: must be a finite number" in r.output, r.output
    with open_store(cli.data_dir) as store:
        assert "nan" not in (store.settings.get("sandbox.jail") or "").lower()
        assert (store.settings.get("sandbox.provider_type") or "") != "jail"


@pytest.mark.parametrize("tenant", ["acme corp", "a/b", "x" * 65, "..", "-x", ".hidden", "tab\there"])
def test_token_create_refuses_a_tenant_the_service_would_refuse(cli, tenant) -> None:
    r = cli("token", "create", "--tenant", tenant)
    assert r.exit_code == 2 and "SB002" in r.output and "tenant_id must be 1-64 characters" in r.output
    _no_traceback(r)
    if (cli.data_dir / "execbox.db").exists():
        with open_store(cli.data_dir) as store:
            assert store.tokens.count() == 0


def test_token_create_takes_every_name_the_service_takes(cli) -> None:
    for tenant in ("acme", "_svc", "a.b-c_9", "x" * 64):
        assert cli("token", "create", "--tenant", tenant).exit_code == 0, tenant


@pytest.mark.parametrize("report,code", [
    ({"zero_config": {"provider": None, "error": "no usable provider"}}, 1),
    ({"zero_config": {"provider": "jail"}, "probe": {"provider": "jail", "ok": False, "error": "boom"}}, 1),
    ({"zero_config": {"provider": "jail"}, "probe": {"provider": "jail", "ok": True, "seconds": 0.1}}, 0),
    ({"zero_config": {"provider": "jail"}}, 0),  # --no-probe
])
@pytest.mark.parametrize("as_json", [True, False])
def test_doctor_exits_non_zero_when_nothing_is_usable_or_the_probe_fails(cli, monkeypatch, report, code,
                                                                         as_json) -> None:
    monkeypatch.setattr("execbox.cli.doctor.collect", lambda probe: {"providers": {}, "tiers": {}, **report})
    r = cli("doctor", *(["--json"] if as_json else []))
    assert r.exit_code == code, r.output
    _no_traceback(r)


@pytest.mark.parametrize("args", [("serve", "--log-level", "verbose"), ("executor", "--log-level", "verbose"),
                                  ("executor", "--port", "99999"), ("executor", "--port", "-1")])
def test_bad_option_values_are_usage_errors(cli, args) -> None:
    r = cli(*args)
    assert r.exit_code == 2, r.output
    assert "Invalid value for" in r.output
    _no_traceback(r)


def _other_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def test_secrets_status_and_config_show_fail_when_the_secrets_need_another_key(cli) -> None:
    assert cli("config", "set", "self_managed", "endpoint=http://127.0.0.1:9",
               "api_key=SuperSecretValue1234WXYZ").exit_code == 0
    ok = cli("secrets", "status")
    assert ok.exit_code == 0 and "in use:" in ok.output, ok.output
    assert cli("config", "show").exit_code == 0

    wrong = {"EXECBOX_SECRET_KEY": _other_key()}
    r = cli("secrets", "status", env=wrong)
    assert r.exit_code == 2, r.output
    assert "cannot decrypt sandbox.self_managed.api_key: it was encrypted with key" in r.output
    _no_traceback(r)
    for args in (("config", "show"), ("config", "show", "--json"), ("config", "show", "self_managed")):
        r = cli(*args, env=wrong)
        assert r.exit_code == 2 and "SB002" in r.output and "self_managed" in r.output, (args, r.output)
        assert "SuperSecretValue" not in r.output
    assert json.loads(cli("config", "show", "--json", env=wrong).stdout)["self_managed"]["error"].startswith("SB002")


class _NotExecbox(BaseHTTPRequestHandler):
    paths: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        _NotExecbox.paths.append(self.path)
        body = b"<html><body>502 Bad Gateway (proxy)</body></html>"
        self.send_response(502)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def not_execbox():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotExecbox)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _NotExecbox.paths = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_session_call_answered_by_something_else_is_not_sb000(cli, not_execbox) -> None:
    r = cli("session", "pause", "acme", "s1", "--url", not_execbox, "--token", "ebx_x")
    assert r.exit_code == 2 and "SB009" in r.output and "did not carry execbox's error object" in r.output, r.output
    assert "SB000" not in r.output
    assert _NotExecbox.paths == ["/v1/sandbox/sessions/acme/s1/pause"]


@pytest.mark.parametrize("tenant,session", [("../x", "s"), ("acme", "../../admin"), ("a/b", "s"), ("..", "s")])
def test_session_ids_that_would_leave_their_path_segment_are_refused(cli, not_execbox, tenant, session) -> None:
    r = cli("session", "rm", tenant, session, "--url", not_execbox, "--token", "ebx_x")
    assert r.exit_code == 2 and "SB002" in r.output, r.output
    assert _NotExecbox.paths == []  # nothing was sent
