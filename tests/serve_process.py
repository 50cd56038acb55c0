"""A real `execbox serve` subprocess for session fixtures: started on a free loopback port with
its own data dir, waited for on /healthz, and stopped with SIGTERM (the way an operator stops it).

Shared by the browser tests and the E2B/conformance server (tests/e2b_server.py); also the jail
readiness check both need (the `sci` runtime has numpy, pandas and matplotlib).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.conftest import require

RUNTIME = "sci"  # jail runtime with numpy, pandas, matplotlib (scripts/setup/test/20-jail-runtime.sh)


def require_jail_runtime(name: str = RUNTIME) -> None:
    from execbox.boxes import runtime
    from execbox.providers.jail import JailProvider

    ok, reason = JailProvider.availability()
    require(ok, f"bubblewrap jail ({reason})")
    try:
        runtime.resolve(name)
        has_runtime = True
    except runtime.RuntimeNotUsable:
        has_runtime = False
    require(has_runtime, f"jail runtime {name!r} (scripts/setup/test/20-jail-runtime.sh)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(data_dir: str, *, drop_env: tuple[str, ...] = ("SANDBOX_",),
          env: dict[str, str] | None = None) -> Iterator[tuple[str, Path]]:
    """Yield (url, log path) of a started `execbox serve`; environment variables starting with any of
    ``drop_env`` (and EXECBOX_DATABASE_URL) are not passed on, so the server uses its own data dir."""
    port = _free_port()
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(drop_env) and k != "EXECBOX_DATABASE_URL"}
    child_env.update({"EXECBOX_DATA_DIR": data_dir, **(env or {})})
    log = Path(data_dir) / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "execbox", "serve", "--host", "127.0.0.1",
                                 "--port", str(port), "--log-level", "warning"],
                                stdout=out, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"execbox serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"execbox serve did not answer /healthz within 90 s:\n{log.read_text()[-4000:]}")
            time.sleep(0.2)
        yield url, log
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, as an operator stops the service; SIGKILL if it has not exited within 30 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
