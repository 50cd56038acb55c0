"""`execbox executor` and `execbox run` use the settings store's active provider and its stored
settings when a store exists, as their help, the README and docs/executor-api.md say; without
one they create nothing and keep the zero-configuration choice (review 50, F9)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from execbox.cli import app


@pytest.fixture
def cli(tmp_path, monkeypatch):
    for var in ("SANDBOX_TYPE", "SANDBOX_BACKEND", "EXECBOX_DATABASE_URL", "EXECBOX_SECRET_KEY",
                "SANDBOX_TIMEOUT_SEC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("EXECBOX_DATA_DIR", str(tmp_path / "data"))
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args))

    invoke.data_dir = tmp_path / "data"
    return invoke


@pytest.fixture
def slow_program(tmp_path):
    prog = tmp_path / "slow.py"
    prog.write_text("import time\ntime.sleep(8)\nprint('finished')\n")
    return str(prog)


def test_run_uses_the_stored_settings_of_the_provider(cli, slow_program) -> None:
    assert cli("config", "set", "local", "timeout=1").exit_code == 0
    r = cli("run", "-p", "local", slow_program)
    assert r.exit_code == 124 and "finished" not in r.output, r.output  # the stored 1s, not the default 30s


def test_run_uses_the_stored_active_provider(cli, slow_program) -> None:
    assert cli("config", "set", "local", "timeout=1", "--activate").exit_code == 0
    r = cli("run", slow_program)
    assert r.exit_code == 124, r.output


def test_run_without_a_store_creates_none(cli, tmp_path) -> None:
    prog = tmp_path / "quick.py"
    prog.write_text("print(6 * 7)\n")
    r = cli("run", "-p", "local", str(prog))
    assert r.exit_code == 0 and r.stdout == "42\n", r.output
    assert not cli.data_dir.exists()


def test_executor_serves_the_stored_active_provider_with_its_settings(cli, monkeypatch) -> None:
    assert cli("config", "set", "local", "timeout=7", "--activate").exit_code == 0
    served = []

    def fake_app(prov, auth):
        served.append(prov)
        return object()

    monkeypatch.setattr("execbox.service.routes.executor_compat.create_executor_app", fake_app)
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: None)
    r = cli("executor", "--port", "19385")
    try:
        assert r.exit_code == 0, r.output
        assert "provider=local (settings store)" in r.output
        assert served[0].name == "local" and served[0].config["timeout"] == 7
    finally:
        for prov in served:
            prov.shutdown()
    # --config still overrides a stored value
    r = cli("executor", "--port", "19385", "--config", '{"timeout": 9}')
    try:
        assert r.exit_code == 0 and served[-1].config["timeout"] == 9, r.output
    finally:
        served[-1].shutdown()
