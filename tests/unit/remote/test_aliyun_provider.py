"""Provider aliyun_codeinterpreter on the real agentrun-sdk: data plane against a local HTTP fake,
control plane (templates) replaced at the generated OpenAPI client."""

from __future__ import annotations

import shutil

import pytest

from execbox.errors import ConnectionFailedError, InvalidConfigError, PathError, SessionNotFoundError
from execbox.providers.aliyun import AliyunCodeInterpreterProvider
from tests.conftest import require

from .fake_agentrun import FakeAgentRun, create_fake_agentrun_app, install_fake_control_plane
from .http_server import ThreadedServer

ENV = ("AGENTRUN_ACCESS_KEY_ID", "AGENTRUN_ACCESS_KEY_SECRET", "AGENTRUN_ACCOUNT_ID", "AGENTRUN_REGION",
       "AGENTRUN_CONTROL_ENDPOINT", "AGENTRUN_DATA_ENDPOINT", "ALIBABA_CLOUD_ACCESS_KEY_ID",
       "ALIBABA_CLOUD_ACCESS_KEY_SECRET")


@pytest.fixture(scope="module")
def fake():
    state = FakeAgentRun()
    srv = ThreadedServer(create_fake_agentrun_app(state)).start()
    yield state, srv
    srv.stop()
    state.cleanup()


@pytest.fixture
def clean_env(monkeypatch):
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DISABLE_BREAKING_CHANGES_WARNING", "1")


@pytest.fixture
def provider(fake, clean_env, monkeypatch):
    require(shutil.which("bwrap") is not None, "bwrap")  # the fake runs cells in a sandbox file system
    state, srv = fake
    install_fake_control_plane(state, monkeypatch)
    p = AliyunCodeInterpreterProvider()
    p.initialize({"access_key_id": state.access_key_id, "access_key_secret": state.access_key_secret,
                  "account_id": state.account_id, "data_endpoint": srv.url})
    yield p
    p.shutdown()


def run(p, code, language="python", arguments=None, timeout=10):
    inst = p.create_instance(language)
    try:
        return p.execute_code(inst.instance_id, code, language, timeout, arguments, inline_artifacts=True)
    finally:
        p.destroy_instance(inst.instance_id)


def test_schema_is_the_seeds():
    s = AliyunCodeInterpreterProvider.get_config_schema()
    assert s["timeout"]["max"] == 30 and s["timeout"]["default"] == 30
    assert s["access_key_id"]["secret"] and s["access_key_secret"]["secret"]
    assert s["account_id"]["required"] is True
    assert s["region"]["options"] == ["cn-hangzhou", "cn-beijing", "cn-shanghai", "cn-shenzhen", "cn-guangzhou"]


def test_env_fallbacks(clean_env, monkeypatch):
    monkeypatch.setenv("AGENTRUN_ACCESS_KEY_ID", "LTAIenv")
    monkeypatch.setenv("AGENTRUN_ACCESS_KEY_SECRET", "env-secret")
    monkeypatch.setenv("AGENTRUN_ACCOUNT_ID", "42")
    monkeypatch.setenv("AGENTRUN_REGION", "cn-beijing")
    p = AliyunCodeInterpreterProvider()
    p.initialize({})
    assert (p.config["access_key_id"], p.config["account_id"], p.config["region"]) == ("LTAIenv", "42", "cn-beijing")
    p2 = AliyunCodeInterpreterProvider()
    p2.initialize({"region": "cn-shenzhen"})  # explicit config wins over the environment
    assert p2.config["region"] == "cn-shenzhen"


def test_missing_and_bad_config_are_sb002(clean_env):
    with pytest.raises(InvalidConfigError, match="account_id"):
        AliyunCodeInterpreterProvider().initialize({"access_key_id": "a", "access_key_secret": "b"})
    with pytest.raises(InvalidConfigError, match="timeout"):
        AliyunCodeInterpreterProvider().initialize({"access_key_id": "a", "access_key_secret": "b",
                                                    "account_id": "1", "timeout": 60})
    with pytest.raises(InvalidConfigError, match="region"):
        AliyunCodeInterpreterProvider().initialize({"access_key_id": "a", "access_key_secret": "b",
                                                    "account_id": "1", "region": "us-east-1"})


def test_template_get_or_create_once(provider, fake):
    state, _ = fake
    state.templates.pop("execbox-code-interpreter", None)
    state.calls.clear()
    a = provider.create_instance()
    b = provider.create_instance()
    ops = [c for c in state.calls if c[0] in ("get_template", "create_template")]
    assert ("create_template", "execbox-code-interpreter") in ops
    assert [o for o in ops if o[0] == "create_template"] == [("create_template", "execbox-code-interpreter")]
    assert state.templates["execbox-code-interpreter"]["templateType"] == "CodeInterpreter"
    provider.destroy_instance(a.instance_id)
    provider.destroy_instance(b.instance_id)


def test_configured_template_is_used(fake, clean_env, monkeypatch):
    state, srv = fake
    install_fake_control_plane(state, monkeypatch)
    state.templates["team-tpl"] = {"templateName": "team-tpl", "templateType": "CodeInterpreter", "status": "READY"}
    p = AliyunCodeInterpreterProvider()
    p.initialize({"access_key_id": state.access_key_id, "access_key_secret": state.access_key_secret,
                  "account_id": state.account_id, "data_endpoint": srv.url, "template_name": "team-tpl"})
    inst = p.create_instance()
    assert state.sandboxes[inst.metadata["sandbox_id"]]["body"]["templateName"] == "team-tpl"
    p.shutdown()


def test_python_main_result_and_signed_requests(provider, fake):
    state, _ = fake
    state.auth_headers_seen.clear()
    r = run(provider, "def main(x, y):\n    print('adding')\n    return {'sum': x + y}\n", arguments={"x": 2, "y": 5})
    assert r.ok, r.stderr
    assert r.stdout == "adding\n"
    assert r.result == {"sum": 7} and r.metadata["result_type"] == "dict"
    r = run(provider, "def main():\n    return {1, 2}\n")
    assert r.exit_code == 1 and "not JSON-serializable" in r.stderr
    seen = "".join(str(h) for h in state.auth_headers_seen)
    assert state.access_key_secret not in seen  # signed, never sent


def test_delete_passes_config_and_removes_sandbox(provider, fake):
    state, _ = fake
    inst = provider.create_instance()
    sid = inst.metadata["sandbox_id"]
    assert provider.destroy_instance(inst.instance_id) is True
    assert state.sandboxes[sid]["deleted"] is True
    assert provider.destroy_instance(inst.instance_id) is False


def test_connect_by_id_when_not_cached(provider, fake):
    state, _ = fake
    inst = provider.create_instance()
    provider.forget_connection(inst.instance_id)
    state.calls.clear()
    r = provider.execute_code(inst.instance_id, "print('again')", "python", 10)
    assert r.stdout == "again\n"
    assert ("get_sandbox", inst.metadata["sandbox_id"]) in state.calls
    provider.destroy_instance(inst.instance_id)


def test_error_and_stderr(provider):
    r = run(provider, "import sys\nprint('to err', file=sys.stderr)\nraise KeyError('missing')\n")
    assert r.exit_code == 1
    assert "KeyError" in r.stderr and "to err" in r.stderr
    assert r.metadata["result_present"] is False


def test_javascript(provider):
    require(shutil.which("node") is not None, "node")
    r = run(provider, "function main(args) { return { n: args.n + 1 } }", "javascript", {"n": 1})
    assert r.ok, r.stderr
    assert r.result == {"n": 2}


def test_timeout_hard_limit_and_timeout_status(provider):
    inst = provider.create_instance()
    try:
        with pytest.raises(InvalidConfigError, match="hard limit of 30s"):
            provider.execute_code(inst.instance_id, "print(1)", "python", 31)
        r = provider.execute_code(inst.instance_id, "import time\ntime.sleep(5)", "python", 1)
        assert r.timed_out and r.error_code == "SB005"
    finally:
        provider.destroy_instance(inst.instance_id)


def test_artifacts_via_file_api(provider):
    code = "open('artifacts/plot.png', 'wb').write(b'\\x89PNG-bytes')\n"
    r = run(provider, code)
    [a] = r.artifacts
    assert a.name == "plot.png" and a.mime_type == "image/png" and a.read_bytes() == b"\x89PNG-bytes"


def test_files_round_trip_and_path_validation(provider):
    inst = provider.create_instance()
    try:
        provider.write_file(inst.instance_id, "in/data.bin", bytes(range(256)))
        assert provider.read_bytes(inst.instance_id, "in/data.bin") == bytes(range(256))
        r = provider.execute_code(inst.instance_id, "print(len(open('in/data.bin','rb').read()))", "python", 10)
        assert r.stdout == "256\n"
        with pytest.raises(PathError):
            provider.read_bytes(inst.instance_id, "../../etc/passwd")
        provider.execute_code(inst.instance_id, "import os\nos.symlink('/etc', 'outside')", "python", 10)
        with pytest.raises(PathError):  # the agent's path check resolves symlinks; the file API would follow
            provider.read_bytes(inst.instance_id, "outside/passwd")
        provider.write_file(inst.instance_id, "in/log.txt", "a\n")
        provider.write_file(inst.instance_id, "in/log.txt", "b\n", mode="append")
        assert provider.read_file(inst.instance_id, "in/log.txt").content == "a\nb\n"
        assert [f.path for f in provider.list_files(inst.instance_id, "in")] == ["in/data.bin", "in/log.txt"]
    finally:
        provider.destroy_instance(inst.instance_id)


def test_bash_run_command_and_unknown_instance(provider):
    """bash is the agent's (the AgentRun cell only starts it), so runs and run_command work."""
    with pytest.raises(SessionNotFoundError):
        provider.execute_code("t:s:x", "print(1)", "python", 5)
    assert "bash" in provider.get_supported_languages()
    inst = provider.create_instance()
    try:
        r = provider.execute_code(inst.instance_id, "echo out; echo err >&2; exit 4", "bash", 5)
        assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 4)
        provider.make_dir(inst.instance_id, "d")
        r = provider.run_command(inst.instance_id, "echo $X > f && cat f && basename $PWD", 10, cwd="d",
                                 env={"X": "hi"})
        assert (r.stdout, r.exit_code) == ("hi\nd\n", 0), r.stderr
        with pytest.raises(InvalidConfigError):
            provider.run_command(inst.instance_id, "  ", 10)
        with pytest.raises(InvalidConfigError, match="hard limit"):
            provider.run_command(inst.instance_id, "true", 31)
    finally:
        provider.destroy_instance(inst.instance_id)


def test_a_template_without_bash_is_a_clear_error(provider):
    """A failed bash run asks once whether the sandbox has bash; without it the error names the template."""
    inst = provider.create_instance()
    try:
        assert provider.execute_code(inst.instance_id, "exit 3", "bash", 5).exit_code == 3  # bash is there
        assert provider._has_bash[inst.instance_id] is True
        provider._has_bash[inst.instance_id] = False  # as the probe answers on an image without bash
        with pytest.raises(InvalidConfigError, match="bash is not installed in the AgentRun template") as e:
            provider.execute_code(inst.instance_id, "exit 3", "bash", 5)
        assert e.value.http_status == 501
    finally:
        provider.destroy_instance(inst.instance_id)


def test_wrong_access_key_is_sb003_without_the_secret(fake, clean_env, monkeypatch):
    state, srv = fake
    install_fake_control_plane(state, monkeypatch)
    state.templates.pop("execbox-code-interpreter", None)
    p = AliyunCodeInterpreterProvider()
    p.initialize({"access_key_id": "LTAIwrongwrong", "access_key_secret": "top-secret-zzzz",
                  "account_id": state.account_id, "data_endpoint": srv.url})
    with pytest.raises(Exception) as e:
        p.create_instance()
    assert isinstance(e.value, ConnectionFailedError), e.value
    assert "top-secret" not in str(e.value)
    assert p.health_check() is False
