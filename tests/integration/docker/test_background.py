"""Background processes and JS contexts in Docker boxes (runc, runsc): privsep'd, beside exec."""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import wait_process_exit

pytestmark = pytest.mark.docker


def test_background_process_runs_as_the_sandbox_user_beside_an_exec(provider, instance):
    """The exec runs until the test releases it (a file it writes), so the background process
    starts and ends beside it however slow the machine is."""
    hold = ("import os, time\nopen('exec-started', 'w').close()\nt = time.monotonic()\n"
            "while not os.path.exists('exec-release') and time.monotonic() - t < 60:\n    time.sleep(0.05)\n"
            "print('released')")
    result = {}
    slow = threading.Thread(target=lambda: result.setdefault(
        "r", provider.execute_code(instance, hold, "python", 120)), daemon=True)
    slow.start()
    deadline = time.monotonic() + 30
    while not provider.glob(instance, "exec-started") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert provider.glob(instance, "exec-started"), "the exec did not start"
    pid = provider.start_process(instance, "read x; echo $x $(id -u) $(id -g)", stdin=True)
    provider.process_input(instance, pid, b"hello\n")
    out, _, v = wait_process_exit(provider, instance, pid)
    assert slow.is_alive(), "the exec ended before it was released"
    uid = provider._instances[instance].box.host.uid
    assert out == f"hello {uid} {uid}\n".encode() and v["exit_code"] == 0
    provider.write_file(instance, "exec-release", "")
    slow.join(60)
    assert result["r"].stdout == "released\n"


def test_javascript_context_keeps_globals(provider, instance):
    assert provider.execute_code(instance, "var n = 20", "javascript", 20, context_id="js").exit_code == 0
    assert provider.execute_code(instance, "n * 2 + 2", "javascript", 20, context_id="js").result == 42
