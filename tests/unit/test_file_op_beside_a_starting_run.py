"""A file operation that arrives after a run has taken its session but before the run has
started (its box still being made: a new or resumed session) goes beside the run once it starts,
as envd serves files during runs; it does not wait for the whole run (local provider)."""

from __future__ import annotations

import threading
import time

from execbox.service.config import ServiceSettings
from execbox.service.executions import RunService
from execbox.service.logs import OperationLog
from execbox.service.metrics import ServiceMetrics
from execbox.service.sessions import SessionManager
from tests.integration.service.conftest import Holder


def test_a_file_op_goes_beside_a_run_that_starts_after_it_arrived(local_provider, tmp_path) -> None:
    settings = ServiceSettings()
    sessions = SessionManager(Holder(local_provider), settings, str(tmp_path), None)
    runs = RunService(sessions, ServiceMetrics(), OperationLog(None, settings.audit_code))
    with sessions.session("t", "s") as s:
        local_provider.write_file(s.instance_id, "f.txt", "hello")
    held, done = threading.Event(), threading.Event()

    def run() -> None:  # what RunService.run does, with a slow start and a long run
        with sessions.session("t", "s") as s:
            held.set()
            time.sleep(0.3)  # its box being made: the session is held, nothing runs yet
            s.running += 1
            done.wait(10)  # the run
            s.running -= 1

    t = threading.Thread(target=run)
    t.start()
    try:
        assert held.wait(5)
        started = time.monotonic()
        page = runs.file_op("t", "s", "read_file", "f.txt", None, lambda p, i: p.read_file(i, "f.txt"))
        took = time.monotonic() - started
        assert page.content == "hello"
        assert took < 3, took  # beside the run once it started, not after its 10 s
    finally:
        done.set()
        t.join()
        sessions.shutdown()
