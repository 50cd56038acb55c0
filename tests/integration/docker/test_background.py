"""Background processes and JS contexts in Docker boxes (runc, runsc): privsep'd, beside exec."""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import wait_process_exit

pytestmark = pytest.mark.docker


def test_background_process_runs_as_the_sandbox_user_beside_an_exec(provider, instance):
    slow = threading.Thread(target=provider.execute_code, args=(instance, "import time; time.sleep(2)", "python", 20))
    slow.start()
    time.sleep(0.3)
    pid = provider.start_process(instance, "read x; echo $x $(id -u) $(id -g)", stdin=True)
    provider.process_input(instance, pid, b"hello\n")
    out, _, v = wait_process_exit(provider, instance, pid)
    assert slow.is_alive(), "the background process waited for the exec"
    uid = provider._instances[instance].box.host.uid
    assert out == f"hello {uid} {uid}\n".encode() and v["exit_code"] == 0
    slow.join(30)


def test_javascript_context_keeps_globals(provider, instance):
    assert provider.execute_code(instance, "var n = 20", "javascript", 20, context_id="js").exit_code == 0
    assert provider.execute_code(instance, "n * 2 + 2", "javascript", 20, context_id="js").result == 42
