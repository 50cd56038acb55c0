"""`execbox exec --json` (the one-subprocess entry point for Go/Node hosts) on the remote providers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import require
from tests.unit.remote.fake_agentrun import FakeAgentRun, create_fake_agentrun_app, install_fake_control_plane
from tests.unit.remote.fake_e2b import FakeE2B, create_fake_e2b_app, fake_commands_run
from tests.unit.remote.http_server import ThreadedServer

CODE = "def main(a, b):\n    print('adding')\n    open('artifacts/sum.txt', 'w').write(str(a + b))\n" \
       "    return {'sum': a + b}\n"


def exec_json(request: dict) -> tuple[int, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SANDBOX_", "E2B_", "AGENTRUN_"))}
    env["DISABLE_BREAKING_CHANGES_WARNING"] = "1"
    p = subprocess.run([sys.executable, "-m", "execbox", "exec", "--json"], input=json.dumps(request),
                       capture_output=True, text=True, env=env, timeout=120)
    return p.returncode, json.loads(p.stdout)


def check_reply(code: int, reply: dict) -> None:
    assert code == 0, reply
    r = reply["result"]
    assert r["stdout"] == "adding\n"
    assert r["result"] == {"sum": 5}
    [art] = r["artifacts"]
    assert art["name"] == "sum.txt" and art["content_b64"] == "NQ=="


def test_self_managed(executor_server):
    code, reply = exec_json({"code": CODE, "arguments": {"a": 2, "b": 3}, "provider": "self_managed",
                             "config": {"endpoint": executor_server.url}})
    check_reply(code, reply)


def test_e2b_in_process(monkeypatch):
    """The fake's commands.run stand-in (envd's process API is Connect-RPC) lives in this process."""
    from e2b.sandbox_sync.commands.command import Commands

    from execbox.cli.run import handle_exec_request

    require(shutil.which("bwrap") is not None, "bwrap")  # the fake's commands see a sandbox file system
    state = FakeE2B()
    srv = ThreadedServer(create_fake_e2b_app(state)).start()
    for var in ("E2B_API_KEY", "E2B_DOMAIN", "E2B_API_URL", "E2B_SANDBOX_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(Commands, "run", fake_commands_run(state))
    try:
        reply = handle_exec_request({
            "code": CODE, "arguments": {"a": 2, "b": 3}, "provider": "e2b",
            "config": {"api_key": state.api_key, "api_url": srv.url, "sandbox_url": srv.url},
            "files": {"input.txt": "hello"}})
        reply = json.loads(json.dumps(reply, default=str))
        check_reply(0, reply)
        assert reply["result"]["metadata"]["provider"] == "e2b"
    finally:
        srv.stop()
        state.cleanup()


def test_aliyun_in_process(monkeypatch):
    """The control-plane stand-in lives in this process, so this one calls the exec handler directly."""
    from execbox.cli.run import handle_exec_request

    state = FakeAgentRun()
    srv = ThreadedServer(create_fake_agentrun_app(state)).start()
    for var in ("AGENTRUN_ACCESS_KEY_ID", "AGENTRUN_ACCESS_KEY_SECRET", "AGENTRUN_ACCOUNT_ID"):
        monkeypatch.delenv(var, raising=False)
    install_fake_control_plane(state, monkeypatch)
    try:
        reply = handle_exec_request({
            "code": CODE, "arguments": {"a": 2, "b": 3}, "provider": "aliyun_codeinterpreter",
            "config": {"access_key_id": state.access_key_id, "access_key_secret": state.access_key_secret,
                       "account_id": state.account_id, "data_endpoint": srv.url}})
        check_reply(0, json.loads(json.dumps(reply, default=str)))
    finally:
        srv.stop()
        state.cleanup()


def test_bad_remote_config_is_a_json_error():
    code, reply = exec_json({"code": "print(1)", "provider": "self_managed", "config": {"endpoint": "ftp://x"}})
    assert code == 2 and reply["ok"] is False
    assert reply["error"]["code"] == "SB002" and "endpoint" in reply["error"]["message"]


@pytest.mark.parametrize("secret_field, provider, config", [
    ("api_key", "e2b", {"api_key": "e2b_supersecret_value_0000", "api_url": "http://127.0.0.1:9",
                        "sandbox_url": "http://127.0.0.1:9"}),
    ("access_key_secret", "aliyun_codeinterpreter", {
        "access_key_id": "LTAIunreachable01", "access_key_secret": "agentrun-secret-value-77",
        "account_id": "1", "template_name": "t", "control_endpoint": "http://127.0.0.1:9",
        "data_endpoint": "http://127.0.0.1:9"}),
])
def test_unreachable_cloud_is_sb003_and_never_shows_the_secret(secret_field, provider, config):
    code, reply = exec_json({"code": "print(1)", "provider": provider, "config": config})
    assert code == 2 and reply["ok"] is False
    assert reply["error"]["code"] == "SB003", reply
    assert config[secret_field] not in json.dumps(reply)
