"""`execbox serve` start (review 50): a start that fails creates no first-start admin token (F5),
misspelled EXECBOX_*/SANDBOX_* variables are warned about with the nearest known name, and the
banner names the database (F8)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from execbox.service.store import open_store

from .conftest import free_port, traversable_tmpdir

EXECBOX = os.path.join(os.path.dirname(sys.executable), "execbox")


def _env(data: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SANDBOX_", "EXECBOX_"))}
    return {**env, "EXECBOX_DATA_DIR": data, "SANDBOX_TYPE": "local", **extra}


def _tokens(data: str) -> int:
    if not os.path.exists(os.path.join(data, "execbox.db")):
        return 0
    with open_store(data) as store:
        return store.tokens.count()


def test_a_start_that_fails_creates_no_admin_token() -> None:
    data = os.path.join(traversable_tmpdir("execbox-serve-"), "data")
    # refused after the store is open: the unisolated provider on a non-loopback address
    r = subprocess.run([EXECBOX, "serve", "--host", "0.0.0.0", "--port", str(free_port())],
                       env=_env(data), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--allow-no-isolation" in r.stderr, r.stderr
    assert "created an admin token" not in r.stderr and "ebx_" not in r.stderr
    assert _tokens(data) == 0
    # the port is taken: refused before anything is created, with the misspelling pointed out
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([EXECBOX, "serve", "--port", str(port)],
                           env=_env(data, EXECBOX_DATABSE_URL="postgresql://u@db/x", SANDBOX_IDLE_TIMOUT="5"),
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}: it is in use" in r.stderr, r.stderr
    assert "EXECBOX_DATABSE_URL is not an environment variable execbox reads" in r.stderr
    assert "(did you mean EXECBOX_DATABASE_URL?)" in r.stderr
    assert "(did you mean SANDBOX_IDLE_TIMEOUT?)" in r.stderr
    assert "Traceback" not in r.stderr and "ebx_" not in r.stderr
    assert _tokens(data) == 0


def test_a_start_names_its_database_and_prints_the_token_once() -> None:
    data = os.path.join(traversable_tmpdir("execbox-serve-"), "data")
    port = free_port()
    proc = subprocess.Popen([EXECBOX, "serve", "--port", str(port), "--log-level", "WARNING"], env=_env(data),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert f"database sqlite:///{os.path.realpath(data)}/execbox.db" in err, err
    assert err.count("created an admin token") == 1 and _tokens(data) == 1
    assert "is not an environment variable execbox reads" not in err
