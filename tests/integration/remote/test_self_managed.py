"""Provider self_managed against execbox's own /run served by a real uvicorn on loopback."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from execbox import execute_code
from execbox.errors import (
    ConnectionFailedError,
    ExecutionTimeoutError,
    InvalidConfigError,
    ProviderUnavailableError,
)
from execbox.providers.self_managed import SelfManagedProvider
from execbox.service.routes.executor_compat import ExecutorAuth, create_executor_app
from tests.conftest import require

from .conftest import ThreadedServer, free_port, start_executor_process, wait_healthy


@pytest.fixture
def remote(executor_server):
    p = SelfManagedProvider()
    p.initialize({"endpoint": executor_server.url, "timeout": 10, "max_retries": 0})
    yield p
    p.shutdown()


def run(p: SelfManagedProvider, code: str, language: str = "python", timeout: float = 10, arguments=None):
    inst = p.create_instance(language)
    try:
        return p.execute_code(inst.instance_id, code, language, timeout, arguments, inline_artifacts=True)
    finally:
        p.destroy_instance(inst.instance_id)


def test_health_check(remote):
    assert remote.health_check() is True


def test_health_check_false_when_nothing_listens():
    p = SelfManagedProvider()
    p.initialize({"endpoint": f"http://127.0.0.1:{free_port()}"})
    assert p.health_check() is False


def test_success_result_memory_and_artifacts(remote, server_provider):
    code = ("def main(a, b):\n    print('sum')\n"
            "    open('artifacts/out.txt', 'w').write(str(a + b))\n    return {'sum': a + b}\n")
    r = run(remote, code, arguments={"a": 2, "b": 3})
    assert r.ok and r.exit_code == 0
    assert r.stdout == "sum\n"
    assert r.result == {"sum": 5}
    assert r.metadata["result_present"] is True
    assert r.metadata["peak_memory_kb"] > 0
    assert r.metadata["isolation"] == server_provider.isolation.value  # what the remote reported
    assert r.metadata["provider"] == "self_managed"
    [art] = r.artifacts
    assert art.name == "out.txt" and art.mime_type == "text/plain"
    assert art.read_bytes() == b"5"


def test_javascript(remote, node_available):
    require(node_available, "node")
    r = run(remote, "function main(args) { return args.x * 2 }", "javascript", arguments={"x": 21})
    assert r.ok and r.result == 42


def test_program_error_is_a_result_not_an_exception(remote):
    r = run(remote, "raise KeyError('k')")
    assert not r.ok and r.exit_code == 1
    assert "KeyError" in r.stderr
    assert r.error_code is None
    assert r.metadata["remote_status"] == "program_error"


def test_timeout_maps_to_sb005(remote):
    r = run(remote, "import time\ntime.sleep(30)", timeout=1)
    assert r.timed_out is True
    assert r.error_code == "SB005"
    with pytest.raises(ExecutionTimeoutError):
        r.raise_for_status()


def test_one_megabyte_arguments_round_trip(remote):
    r = run(remote, "def main(blob):\n    return len(blob)\n", arguments={"blob": "y" * 1_000_000})
    assert r.result == 1_000_000


def test_unsupported_operations_name_the_provider(remote):
    inst = remote.create_instance()
    with pytest.raises(InvalidConfigError, match="self_managed") as e:
        remote.read_file(inst.instance_id, "x.txt")
    assert e.value.http_status == 501
    with pytest.raises(InvalidConfigError, match="not supported by self_managed") as e:
        remote.execute_code(inst.instance_id, "echo hi", "bash")
    assert e.value.http_status == 501
    with pytest.raises(InvalidConfigError, match="self_managed"):
        remote.execute_code(inst.instance_id, "x = 1", "python", context_id="c1")


def test_execute_code_api_with_provider_name(executor_server):
    r = execute_code("def main(n):\n    return n + 1\n", "python", 10, {"n": 41}, provider="self_managed",
                     config={"endpoint": executor_server.url})
    assert r.result == 42


def test_connect_error_without_retries_is_sb003():
    p = SelfManagedProvider()
    p.initialize({"endpoint": f"http://127.0.0.1:{free_port()}", "max_retries": 0})
    inst = p.create_instance()
    with pytest.raises(ConnectionFailedError) as e:
        p.execute_code(inst.instance_id, "print(1)", "python", 5)
    assert e.value.code == "SB003" and e.value.details["attempts"] == 1


def test_retries_until_a_late_server_starts(server_provider):
    port = free_port()
    app = create_executor_app(server_provider, auth=ExecutorAuth(open=True), owns_provider=False)
    late = ThreadedServer(app, port)
    timer = threading.Timer(0.8, late.start, kwargs={"wait": False})
    started = time.monotonic()  # from the timer's start: set-up time under load must not count
    timer.start()
    p = SelfManagedProvider()
    p.initialize({"endpoint": late.url, "max_retries": 6, "timeout": 10})
    try:
        inst = p.create_instance()
        r = p.execute_code(inst.instance_id, "print('late but fine')", "python", 10)
        assert r.stdout == "late but fine\n"
        assert time.monotonic() - started >= 0.7  # it really waited for the server
    finally:
        timer.join()
        late.stop()
        p.shutdown()


def test_server_killed_mid_request_is_not_retried(tmp_path):
    """The code started running; the connection drops; the client must not send it again."""
    port = free_port()
    proc = start_executor_process(port, provider="local")
    marker = tmp_path / "runs.txt"
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
        p = SelfManagedProvider()
        p.initialize({"endpoint": f"http://127.0.0.1:{port}", "max_retries": 5, "timeout": 20})
        inst = p.create_instance()
        code = f"import time\nopen({str(marker)!r}, 'a').write('ran\\n')\ntime.sleep(8)\n"

        def kill_when_running() -> None:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not marker.exists():
                time.sleep(0.02)
            os.killpg(proc.pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_when_running)
        killer.start()
        with pytest.raises(ProviderUnavailableError) as e:
            p.execute_code(inst.instance_id, code, "python", 20)
        killer.join()
        assert e.value.code == "SB009"
        assert e.value.details["retried"] is False
        time.sleep(0.3)
        assert marker.read_text() == "ran\n"  # executed exactly once
        p.shutdown()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_bearer_token_is_sent_and_required(server_provider):
    app = create_executor_app(server_provider, auth=ExecutorAuth(token="s3cret-token-1234"), owns_provider=False)
    srv = ThreadedServer(app, free_port()).start()
    try:
        anon = SelfManagedProvider()
        anon.initialize({"endpoint": srv.url})
        inst = anon.create_instance()
        with pytest.raises(Exception) as e:
            anon.execute_code(inst.instance_id, "print(1)", "python", 5)
        # the remote's 401 is this provider's misconfiguration (SB003 naming the key), not the
        # tenant's: a 401 relayed as it is would tell the tenant its own token was refused
        assert e.value.code == "SB003" and "self_managed.api_key" in e.value.message
        assert e.value.details == {"http_status": 401} and "s3cret" not in str(e.value)
        authed = SelfManagedProvider()
        authed.initialize({"endpoint": srv.url, "api_key": "s3cret-token-1234"})
        inst = authed.create_instance()
        assert authed.execute_code(inst.instance_id, "print(1)", "python", 5).stdout == "1\n"
    finally:
        srv.stop()
