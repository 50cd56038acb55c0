"""Provider e2b on the real e2b-code-interpreter SDK, against a local fake of E2B's HTTP APIs."""

from __future__ import annotations

import os
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
    from e2b.sandbox_sync.commands.command import Commands

    require(shutil.which("bwrap") is not None, "bwrap")  # the fake's commands see a sandbox file system
    state, srv = fake
    monkeypatch.setattr(Commands, "run", fake_commands_run(state))
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


def test_max_memory_caps_each_run_inside_the_sandbox(fake, monkeypatch):
    """A run past max_memory is SB006 from the agent in the sandbox (not a bare exit -9), and the next works."""
    for bad, why in (("8m", "at least 32m"), ("lots", "max_memory")):
        with pytest.raises(InvalidConfigError, match=why):
            E2BProvider().initialize({"api_key": "e2b_x", "max_memory": bad})
    from e2b.sandbox_sync.commands.command import Commands

    require(shutil.which("bwrap") is not None, "bwrap")
    state, srv = fake
    monkeypatch.setattr(Commands, "run", fake_commands_run(state))
    p = E2BProvider()
    p.initialize({"api_key": state.api_key, "api_url": srv.url, "sandbox_url": srv.url, "timeout": 10,
                  "max_memory": "128m"})
    try:
        r = run(p, "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 1024 * 1024))\n")
        assert r.error_code == "SB006" and r.exit_code != 0, (r.exit_code, r.stderr[-300:])
        assert run(p, "print(len(bytearray(64 * 1024 * 1024)))").stdout == f"{64 * 1024 * 1024}\n"
    finally:
        p.shutdown()


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


def test_agent_uploaded_once_per_sandbox_under_a_hash_versioned_path(provider, fake):
    from execbox.providers.remote_agent import bundle, installed_path

    state, _ = fake
    seen = len(state.uploaded)
    inst = provider.create_instance("python", tenant_id="t1")
    try:
        sb = state.sandboxes[inst.metadata["sandbox_id"]]
        for i in range(3):
            assert provider.execute_code(inst.instance_id, f"print({i})", "python", 10).stdout == f"{i}\n"
        uploads = [p for p in state.uploaded[seen:] if p.endswith(".pyz")]
        assert uploads == [f"/home/user/.execbox-agent-{bundle()[0]}.pyz"]  # once, not per run
        assert os.path.isdir(state.map_path(sb, installed_path()))
        assert sorted(os.listdir(sb.root)) == ["artifacts"]  # staged archive and requests removed
    finally:
        provider.destroy_instance(inst.instance_id)


def test_non_json_result_and_main_guard_are_the_agents_rules(provider):
    r = run(provider, "def main():\n    return object()\n")
    assert r.exit_code == 1 and "not JSON-serializable" in r.stderr and r.result is None
    r = run(provider, "def main():\n    return 1\nif __name__ == '__main__':\n    print('script')\n")
    assert r.ok and r.stdout == "script\n" and r.metadata["result_present"] is False


def test_plain_script_and_error_traceback_line_numbers(provider):
    r = run(provider, "print('a')\nx = 1\nraise ValueError('boom')\n")
    assert r.exit_code == 1
    assert r.stdout == "a\n"
    assert 'File "<code>", line 3' in r.stderr and "ValueError: boom" in r.stderr
    assert r.result is None and r.metadata["result_present"] is False


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
        provider.run_command(inst.instance_id, "ln -s /etc outside", 10)
        for bad in ("../etc/passwd", "/etc/passwd", "a\x00b", "outside/passwd"):
            with pytest.raises(PathError):
                provider.read_bytes(inst.instance_id, bad)
    finally:
        provider.destroy_instance(inst.instance_id)


def test_bash_through_the_agent(provider):
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
        with pytest.raises(InvalidConfigError, match="'e2b' does not support stateful contexts"):
            provider.execute_code(inst.instance_id, "x = 1", "python", 5, context_id="c")
    finally:
        provider.destroy_instance(inst.instance_id)


def test_agent_output_past_the_cap_stops_the_read(provider, monkeypatch):
    """Tenant code can replace the agent in its sandbox; what it prints is collected here, bounded
    (the SDK kept all of it in the service's memory), and a flood ends the call with SB009."""
    from execbox.errors import ProviderUnavailableError
    from execbox.providers import e2b

    assert run(provider, "print('x' * 10000)").stdout == "x" * 10000 + "\n"  # under the real cap
    monkeypatch.setattr(e2b, "STDOUT_CAP", 4000)
    with pytest.raises(ProviderUnavailableError) as err:
        run(provider, "print('x' * 10000)")
    assert "more than 4000 bytes on stdout" in err.value.message
