"""Provider e2b on the real e2b-code-interpreter SDK, against a local fake of E2B's HTTP APIs."""

from __future__ import annotations

import base64
import shutil

import pytest

from execbox.errors import ConnectionFailedError, InvalidConfigError, PathError, SessionNotFoundError
from execbox.providers.e2b import E2BProvider
from tests.conftest import require

from .fake_e2b import FakeE2B, create_fake_e2b_app, fake_commands_run
from .http_server import ThreadedServer


@pytest.fixture(scope="module")
def fake():
    state = FakeE2B()
    srv = ThreadedServer(create_fake_e2b_app(state)).start()
    yield state, srv
    srv.stop()
    state.cleanup()


@pytest.fixture
def provider(fake, monkeypatch):
    state, srv = fake
    for var in ("E2B_API_KEY", "E2B_DOMAIN", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    p = E2BProvider()
    p.initialize({"api_key": state.api_key, "api_url": srv.url, "sandbox_url": srv.url, "timeout": 10})
    yield p
    p.shutdown()


def run(p, code, language="python", arguments=None, timeout=10):
    inst = p.create_instance(language, tenant_id="t1")
    try:
        return p.execute_code(inst.instance_id, code, language, timeout, arguments, inline_artifacts=True)
    finally:
        p.destroy_instance(inst.instance_id)


def test_schema_matches_the_issue_and_ragflow_config():
    schema = E2BProvider.get_config_schema()
    assert schema["api_key"]["secret"] is True and schema["api_key"]["required"] is True
    assert schema["allow_internet_access"]["default"] is False
    assert {"domain", "region", "template", "timeout"} <= set(schema)
    p = E2BProvider()
    p.initialize({"api_key": "e2b_x", "region": "us", "timeout": 30})  # RAGFlow's stored shape
    with pytest.raises(InvalidConfigError, match="domain"):
        E2BProvider().initialize({"api_key": "e2b_x", "region": "eu"})
    assert E2BProvider().initialize({"api_key": "e2b_x", "region": "eu", "domain": "eu.example.com"})
    with pytest.raises(InvalidConfigError, match="api_key"):
        E2BProvider().initialize({})


def test_create_sends_template_metadata_and_no_internet(provider, fake):
    state, _ = fake
    inst = provider.create_instance("python", tenant_id="acme", session_id="s-1")
    sb = state.sandboxes[inst.metadata["sandbox_id"]]
    assert sb.create_body["templateID"] == "code-interpreter-v1"
    assert sb.create_body["metadata"]["tenant"] == "acme"
    assert sb.create_body["metadata"]["session"] == "s-1"
    assert sb.create_body["allow_internet_access"] is False
    assert provider.destroy_instance(inst.instance_id) is True
    assert sb.killed is True
    assert provider.destroy_instance(inst.instance_id) is False


def test_python_main_result_separate_from_stdout(provider, fake):
    code = "def main(name, n):\n    print('working')\n    return {'greeting': 'hi ' + name, 'n': n}\n"
    r = run(provider, code, arguments={"name": "ana", "n": 2})
    assert r.ok, r.stderr
    assert r.stdout == "working\n"
    assert r.result == {"greeting": "hi ana", "n": 2}
    assert r.metadata["result_present"] is True and r.metadata["result_type"] == "dict"
    assert r.metadata["isolation"] == "gvisor"
    assert "__EXECBOX_RESULT_" not in r.stdout + r.stderr


def test_plain_script_and_error_traceback_line_numbers(provider):
    r = run(provider, "print('a')\nx = 1\nraise ValueError('boom')\n")
    assert r.exit_code == 1
    assert r.stdout == "a\n"
    assert 'File "<code>", line 3' in r.stderr and "ValueError: boom" in r.stderr
    assert r.result is None and r.metadata["result_present"] is False
    assert r.metadata["error_name"] == "ValueError"


def test_system_exit_code(provider):
    assert run(provider, "raise SystemExit(3)").exit_code == 3


def test_javascript_main_args(provider):
    require(shutil.which("node") is not None, "node")
    r = run(provider, "function main(args) { console.log('js'); return args.a * 2 }", "javascript", {"a": 21})
    assert r.ok, r.stderr
    assert r.stdout == "js\n" and r.result == 42 and r.metadata["result_type"] == "number"


def test_artifacts_read_back_through_files_api(provider):
    code = "open('artifacts/report.csv', 'w').write('a,b\\n1,2\\n')\nopen('scratch.txt', 'w').write('x')\n"
    r = run(provider, code)
    assert [a.name for a in r.artifacts] == ["report.csv"]
    assert r.artifacts[0].read_bytes() == b"a,b\n1,2\n"
    assert r.artifacts[0].mime_type == "text/csv"


def test_png_svg_and_chart_results_become_artifacts(provider, fake):
    state, _ = fake
    png = b"\x89PNG\r\n\x1a\nfake"
    state.extra_results.append({"type": "result", "png": base64.b64encode(png).decode(), "is_main_result": False})
    state.extra_results.append({"type": "result", "svg": "<svg/>", "is_main_result": False})
    chart = {"type": "line", "title": "t", "x_label": "x", "y_label": "y", "x_unit": None, "y_unit": None,
             "x_ticks": [0, 1], "x_tick_labels": ["0", "1"], "x_scale": "linear", "y_ticks": [0, 1],
             "y_tick_labels": ["0", "1"], "y_scale": "linear", "elements": [{"label": "a", "points": [[0, 1]]}]}
    state.extra_results.append({"type": "result", "chart": chart, "is_main_result": False})
    r = run(provider, "print('plot')")
    names = {a.name: a for a in r.artifacts}
    assert names["figure-1.png"].read_bytes() == png and names["figure-1.png"].mime_type == "image/png"
    assert names["figure-2.svg"].read_bytes() == b"<svg/>"
    assert b'"title": "t"' in names["chart-3.json"].read_bytes()


def test_timeout_is_sb005(provider):
    r = run(provider, "import time\ntime.sleep(4)\n", timeout=1)
    assert r.timed_out is True and r.error_code == "SB005"


def test_one_megabyte_arguments(provider):
    r = run(provider, "def main(blob):\n    return len(blob)\n", arguments={"blob": "z" * 1_000_000})
    assert r.result == 1_000_000


def test_files_write_read_and_path_validation(provider):
    inst = provider.create_instance()
    try:
        provider.write_file(inst.instance_id, "data/in.txt", "line1\nline2\n")
        provider.write_file(inst.instance_id, "data/in.txt", "line3\n", mode="append")
        page = provider.read_file(inst.instance_id, "data/in.txt", offset=1, limit=1)
        assert page.content == "line2\n" and page.total_lines == 3 and page.truncated is True
        r = provider.execute_code(inst.instance_id, "print(open('data/in.txt').read().count('line'))", "python", 10)
        assert r.stdout == "3\n"
        for bad in ("../etc/passwd", "/etc/passwd", "a\x00b"):
            with pytest.raises(PathError):
                provider.read_bytes(inst.instance_id, bad)
    finally:
        provider.destroy_instance(inst.instance_id)


def test_bash_through_commands_run(provider, fake, monkeypatch):
    from e2b.sandbox_sync.commands.command import Commands

    state, _ = fake
    monkeypatch.setattr(Commands, "run", fake_commands_run(state))
    inst = provider.create_instance("bash")
    try:
        ok = provider.execute_code(inst.instance_id, "echo hello; echo err >&2", "bash", 10)
        assert (ok.stdout, ok.stderr, ok.exit_code) == ("hello\n", "err\n", 0)
        bad = provider.run_command(inst.instance_id, "exit 7", 10)
        assert bad.exit_code == 7
        slow = provider.run_command(inst.instance_id, "sleep 5", 1)
        assert slow.timed_out and slow.error_code == "SB005"
    finally:
        provider.destroy_instance(inst.instance_id)


def test_bad_api_key_is_sb003_and_not_echoed(fake):
    _, srv = fake
    p = E2BProvider()
    p.initialize({"api_key": "e2b_wrong_secret_value_9999", "api_url": srv.url, "sandbox_url": srv.url})
    with pytest.raises(ConnectionFailedError) as e:
        p.create_instance()
    assert "wrong_secret" not in str(e.value) and "wrong_secret" not in str(e.value.details)
    assert p.health_check() is False


def test_health_check(provider):
    assert provider.health_check() is True


def test_unknown_instance_and_unsupported_ops(provider):
    with pytest.raises(SessionNotFoundError):
        provider.execute_code("t:s:nope", "print(1)", "python", 5)
    inst = provider.create_instance()
    try:
        with pytest.raises(InvalidConfigError, match="'e2b' does not support list_files"):
            provider.list_files(inst.instance_id)
    finally:
        provider.destroy_instance(inst.instance_id)
