"""Two real `execbox serve` processes sharing one database (SQLite file or PostgreSQL): a config
change made through one reaches the other's next execution without a restart, and fallback serves
from the next provider when the active one is unreachable."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from execbox.service.crypto import encode_key, generate_key
from execbox.service.store import open_store

EXECBOX = str(Path(sys.executable).with_name("execbox"))
LONG_OUTPUT = "print('x' * 5000)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    out = open(log, "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([EXECBOX, "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "warning"], env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"server did not start: {log.read_text()[-2000:]}")


@pytest.fixture
def two_servers(db_url, tmp_path) -> Iterator[dict]:
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SANDBOX_", "EXECBOX_", "E2B_", "AGENTRUN_"))}
    env.update(EXECBOX_DATABASE_URL=db_url, EXECBOX_DATA_DIR=str(data), EXECBOX_SECRET_KEY=encode_key(generate_key()),
               SANDBOX_TYPE="local")
    with open_store(data, url=db_url) as store:
        _, admin = store.tokens.create("ops", "admin")
        _, tenant = store.tokens.create("acme")
    procs = []
    try:
        # two replicas of one database: each its own id (a shared one is refused at start)
        a, url_a = start_server({**env, "EXECBOX_REPLICA_ID": "a"}, tmp_path / "a.log")
        procs.append(a)
        b, url_b = start_server({**env, "EXECBOX_REPLICA_ID": "b"}, tmp_path / "b.log")
        procs.append(b)
        yield {"a": url_a, "b": url_b, "admin": {"Authorization": f"Bearer {admin}"},
               "tenant": {"Authorization": f"Bearer {tenant}"}, "tmp": tmp_path}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


def run(url: str, headers: dict, code: str) -> httpx.Response:
    return httpx.post(url + "/v1/sandbox/execute", json={"code": code, "language": "python"},
                      headers=headers, timeout=60)


def test_config_change_through_one_process_reaches_the_other(two_servers):
    s = two_servers
    for url in (s["a"], s["b"]):
        r = run(url, s["tenant"], LONG_OUTPUT)
        assert r.status_code == 200, r.text
        assert r.json()["truncated"] is False and len(r.json()["stdout"]) == 5001
    r = httpx.post(s["a"] + "/api/admin/sandbox/config", headers=s["admin"], timeout=30,
                   json={"provider_type": "local", "config": {"max_output_bytes": 1024}})
    assert r.status_code == 200, r.text
    # No restart, no wait: the very next execution on B uses the new limit.
    for url in (s["b"], s["a"]):
        body = run(url, s["tenant"], LONG_OUTPUT).json()
        assert body["truncated"] is True and len(body["stdout"]) <= 1024


def test_switching_to_an_unreachable_provider_and_falling_back(two_servers):
    s = two_servers
    dead = f"http://127.0.0.1:{free_port()}"
    r = httpx.post(s["a"] + "/api/admin/sandbox/config", headers=s["admin"], timeout=30,
                   json={"provider_type": "self_managed", "config": {"endpoint": dead, "max_retries": 0}})
    assert r.status_code == 200, r.text
    r = run(s["b"], s["tenant"], "print(1)")
    assert r.status_code == 502 and r.json()["error"]["code"] == "SB003"  # no fallback: no silent switch
    r = httpx.put(s["a"] + "/api/admin/sandbox/fallback", headers=s["admin"], json={"providers": ["local"]})
    assert r.status_code == 200
    body = run(s["b"], s["tenant"], "print('from fallback')").json()
    assert body["stdout"] == "from fallback\n"
    assert body["metadata"]["provider"] == "local"  # the result records who served it
