"""The one real `execbox serve` session fixture (jail provider, `sci` runtime with matplotlib).

Used by the E2B SDK tests (tests/integration/e2b_compat) and the conformance suite (self_managed
with api execbox, e2b against execbox's E2B endpoint). Registered once from tests/conftest.py
(``pytest_plugins``), so one server serves every suite in a session. Two tenants' tokens and an
admin token are made before the server starts.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import require

SANDBOX_DOMAIN = "sandboxes.example"  # {port}-{id}.sandboxes.example routes to a sandbox
RUNTIME = "sci"  # jail runtime with numpy, pandas, matplotlib (scripts/setup/test/20-jail-runtime.sh)


@dataclass
class Server:
    url: str
    admin_token: str
    token_a: str  # tenant "alpha"
    token_b: str  # tenant "beta"
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def e2b_server() -> Iterator[Server]:
    from execbox.boxes import runtime
    from execbox.providers.jail import JailProvider
    from execbox.service.store import open_store

    ok, reason = JailProvider.availability()
    require(ok, f"bubblewrap jail ({reason})")
    try:
        runtime.resolve(RUNTIME)
        has_runtime = True
    except runtime.RuntimeNotUsable:
        has_runtime = False
    require(has_runtime, f"jail runtime {RUNTIME!r} (scripts/setup/test/20-jail-runtime.sh)")

    data_dir = tempfile.mkdtemp(prefix="execbox-e2b-")
    store = open_store(data_dir=data_dir)
    _, admin = store.tokens.create("default", "admin", "e2b tests")
    _, token_a = store.tokens.create("alpha", "tenant", "e2b tests alpha")
    _, token_b = store.tokens.create("beta", "tenant", "e2b tests beta")
    close = getattr(store, "close", None)
    if close:
        close()
    port = _free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SANDBOX_", "E2B_")) and k != "EXECBOX_DATABASE_URL"}
    env["EXECBOX_DATA_DIR"] = data_dir
    env["EXECBOX_E2B_DOMAIN"] = SANDBOX_DOMAIN
    log = Path(data_dir) / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "execbox", "serve", "--host", "127.0.0.1",
                                 "--port", str(port), "--log-level", "warning"],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
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
            proc.kill()
            pytest.fail(f"execbox serve did not answer /healthz within 90 s:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)
    r = httpx.post(f"{url}/api/admin/sandbox/config", headers={"Authorization": f"Bearer {admin}"}, timeout=120,
                   json={"provider_type": "jail", "set_active": True,
                         "config": {"runtime": RUNTIME, "max_memory": "512m", "pool_size": 1}})
    assert r.status_code == 200, r.text
    try:
        yield Server(url, admin, token_a, token_b, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data_dir, ignore_errors=True)
