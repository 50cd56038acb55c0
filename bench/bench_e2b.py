"""The E2B SDK against execbox (jail) vs execbox's own client, side by side over loopback.

Starts `execbox serve` (jail) as a subprocess, then measures with both clients against the same
server: create a sandbox/session, run_code("1+1") and a shell command in it, and kill/close it.
  - e2b SDK: Sandbox.create() starts the box eagerly; run_code goes through the code interpreter
    facade (NDJSON stream); kill is DELETE /sandboxes/{id}.
  - execbox client (baseline): a session's box starts on first use, so "create" is the first
    run_code of a fresh session; close is the admin DELETE of the session.
Targets (issue 15): create <= 50 ms p50, run_code <= 15 ms p50. Shared-machine numbers are noisy:
the load average is printed with the table.
Usage: .venv/bin/python bench/bench_e2b.py [--quick]
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _stats import Row, measure, print_table  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(base: str) -> tuple[subprocess.Popen, str, str]:
    from execbox.service.store import open_store

    data = os.path.join(base, "data")
    store = open_store(data_dir=data)
    token = store.tokens.create("bench", "admin")[1]
    store.engine.dispose()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(EXECBOX_DATA_DIR=data, EXECBOX_WORKSPACES_DIR=os.path.join(base, "ws"), SANDBOX_TYPE="jail",
               SANDBOX_MAX_SESSIONS="200", SANDBOX_TENANT_MAX_SESSIONS="100")
    exe = os.path.join(os.path.dirname(sys.executable), "execbox")
    proc = subprocess.Popen([exe, "serve", "--port", str(port), "--log-level", "warning"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit("execbox serve did not become ready")
        time.sleep(0.2)
    return proc, url, token


def lifecycle_rows(n: int, url: str, token: str) -> list[Row]:
    """create -> run_code -> kill, n times with each client; one row per step."""
    from e2b_code_interpreter import Sandbox

    from execbox import RemoteSandbox

    times: dict[str, list[float]] = {k: [] for k in ("e2b create", "e2b kill", "own create", "own close")}
    wall = {k: 0.0 for k in times}
    for i in range(n + 2):
        t0 = time.perf_counter()
        sb = Sandbox.create(api_key=token, api_url=url, sandbox_url=url)
        t1 = time.perf_counter()
        sb.kill()
        t2 = time.perf_counter()
        own = RemoteSandbox.create(url, token)
        own.run_code("1+1")
        t3 = time.perf_counter()
        own.close()
        t4 = time.perf_counter()
        if i < 2:
            continue  # warm-up
        for key, dt in (("e2b create", t1 - t0), ("e2b kill", t2 - t1), ("own create", t3 - t2),
                        ("own close", t4 - t3)):
            times[key].append(dt * 1000)
            wall[key] += dt
    return [
        Row("own client: new session (first run_code)", times["own create"], wall["own create"], 1),
        Row("e2b SDK: Sandbox.create", times["e2b create"], wall["e2b create"], 1,
            baseline="own client: new session (first run_code)"),
        Row("own client: close (DELETE session)", times["own close"], wall["own close"], 1),
        Row("e2b SDK: kill", times["e2b kill"], wall["e2b kill"], 1, baseline="own client: close (DELETE session)"),
    ]


def run_code_rows(n: int, url: str, token: str) -> list[Row]:
    from e2b_code_interpreter import Sandbox

    from execbox import RemoteSandbox

    sb = Sandbox.create(api_key=token, api_url=url, sandbox_url=url)
    own = RemoteSandbox.create(url, token)
    try:
        assert sb.run_code("1+1").text == "2"
        assert own.run_code("1+1").exit_code == 0
        base = measure("own client: run_code('1+1')", lambda: own.run_code("1+1"), n=n)
        e2b = measure("e2b SDK: run_code('1+1')", lambda: sb.run_code("1+1"), n=n,
                      baseline="own client: run_code('1+1')")
        # commands: the SDK's are agent background processes followed by polling, execbox's own
        # run_command is one exec request
        assert sb.commands.run("echo hi").stdout == "hi\n"
        own_cmd = measure("own client: run_command('echo hi')", lambda: own.run_command("echo hi"), n=n)
        e2b_cmd = measure("e2b SDK: commands.run('echo hi')", lambda: sb.commands.run("echo hi"), n=n,
                          baseline="own client: run_command('echo hi')")
        return [base, e2b, own_cmd, e2b_cmd]
    finally:
        sb.kill()
        own.close()


def main() -> None:
    quick = "--quick" in sys.argv
    base = tempfile.mkdtemp(prefix="execbox-bench-e2b-")
    proc, url, token = start_server(base)
    try:
        rows = lifecycle_rows(10 if quick else 40, url, token)
        rows += run_code_rows(50 if quick else 200, url, token)
        print_table("E2B SDK vs execbox client against `execbox serve` (jail, loopback)", rows)
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}  (2-core shared machine)")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
