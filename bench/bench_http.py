"""HTTP service latency and throughput on the jail provider, against in-process baselines.

Starts `execbox serve` (jail) as a subprocess on a loopback port, then measures:
  - session execute over HTTP (each client thread its own session) at concurrency 1, 4, 16,
    against the same call made in-process on a jail session (baseline: what HTTP adds);
  - one-shot execute over HTTP (fresh box per request) at 1, 4, 16, against in-process
    execbox.execute_code on jail;
  - a burst of 100 concurrent one-shot requests from 10 tenants: errors, then leaked boxes
    (jail boxes of the server beyond its warm pool) and sessions afterwards.
Usage: .venv/bin/python bench/bench_http.py [--quick]
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _stats import Row, measure, print_table  # noqa: E402

CODE = "x = 6 * 7"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def boxes_of(pid: int) -> int:
    """bwrap processes started by the server (its jail boxes), from /proc."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")[0]
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and cmd.endswith(b"bwrap"):
            count += 1
    return count


def start_server(base: str) -> tuple[subprocess.Popen, str, dict[str, str]]:
    from execbox.service.store import open_store

    data = os.path.join(base, "data")
    store = open_store(data_dir=data)
    tokens = {"admin": store.tokens.create("ops", "admin")[1]}
    for i in range(10):
        tokens[f"t{i}"] = store.tokens.create(f"tenant-{i}")[1]
    store.engine.dispose()
    port = free_port()
    env = {**os.environ, "EXECBOX_DATA_DIR": data, "EXECBOX_WORKSPACES_DIR": os.path.join(base, "ws"),
           "SANDBOX_TYPE": "jail", "SANDBOX_MAX_SESSIONS": "200", "SANDBOX_TENANT_MAX_SESSIONS": "100",
           "SANDBOX_TENANT_MAX_EXECUTIONS": "64"}  # the bench measures speed, not the per-tenant limit
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
            raise SystemExit("execbox serve did not become ready")
        time.sleep(0.2)
    return proc, url, tokens


def http_session_fn(url: str, token: str):  # noqa: ANN201
    local = threading.local()

    def call() -> None:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
            local.session = f"bench-{threading.get_ident()}"
        r = local.client.post("/v1/sandbox/execute", json={"code": CODE, "session_id": local.session})
        if r.status_code != 200 or r.json()["exit_code"] != 0:
            raise RuntimeError(r.text[:200])

    return call


def http_oneshot_fn(url: str, token: str):  # noqa: ANN201
    local = threading.local()

    def call() -> None:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        r = local.client.post("/v1/sandbox/execute", json={"code": CODE})
        if r.status_code != 200 or r.json()["exit_code"] != 0:
            raise RuntimeError(r.text[:200])

    return call


def local_session_fn(provider):  # noqa: ANN001, ANN201
    local = threading.local()

    def call() -> None:
        if not hasattr(local, "iid"):
            local.iid = provider.create_instance(tenant_id="bench", session_id=f"l{threading.get_ident()}").instance_id
        if provider.execute_code(local.iid, CODE, "python", 30).exit_code != 0:
            raise RuntimeError("failed")

    return call


def local_oneshot_fn(provider):  # noqa: ANN001, ANN201
    from execbox import execute_code

    def call() -> None:
        if execute_code(CODE, provider=provider).exit_code != 0:
            raise RuntimeError("failed")

    return call


def burst(url: str, tokens: dict[str, str], total: int = 100) -> Row:
    clients = [httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tokens[f't{i}']}"}, timeout=300)
               for i in range(10)]
    samples: list[float] = []
    errors: list[str] = []
    gate = threading.Barrier(total)

    def one(i: int) -> None:
        gate.wait()
        t = time.perf_counter()
        r = clients[i % 10].post("/v1/sandbox/execute", json={"code": CODE})
        samples.append((time.perf_counter() - t) * 1000)
        if r.status_code != 200:
            errors.append(f"{r.status_code} {r.text[:120]}")

    start = time.perf_counter()
    with ThreadPoolExecutor(total) as pool:
        list(pool.map(one, range(total)))
    row = Row("http one-shot burst, 10 tenants", samples, time.perf_counter() - start, total, errors=len(errors))
    for c in clients:
        c.close()
    for e in sorted(set(errors))[:5]:
        print("  burst error:", e)
    return row


def main() -> None:
    quick = "--quick" in sys.argv
    scale = 0.25 if quick else 1.0
    n = lambda k: max(8, int(k * scale))  # noqa: E731
    from execbox.providers.jail import JailProvider

    ok, reason = JailProvider.availability()
    if not ok:
        raise SystemExit(f"jail provider unavailable: {reason}")
    base = tempfile.mkdtemp(prefix="execbox-bench-http-")
    os.chmod(base, 0o711)
    proc, url, tokens = start_server(base)
    local = JailProvider()
    local.initialize({})
    rows: list[Row] = []
    try:
        for c in (1, 4, 16):
            base_name = f"in-process session execute c={c}"
            rows.append(measure(base_name, local_session_fn(local), n=n(200 * max(1, c // 4)), concurrency=c,
                                warmup=3))
            rows.append(measure(f"http session execute c={c}", http_session_fn(url, tokens["t0"]),
                                n=n(200 * max(1, c // 4)), concurrency=c, warmup=3, baseline=base_name))
        for c in (1, 4, 16):
            base_name = f"in-process one-shot c={c}"
            rows.append(measure(base_name, local_oneshot_fn(local), n=n(24 * max(1, c // 2)), concurrency=c,
                                warmup=2))
            rows.append(measure(f"http one-shot c={c}", http_oneshot_fn(url, tokens["t1"]),
                                n=n(24 * max(1, c // 2)), concurrency=c, warmup=2, baseline=base_name))
        local.shutdown()
        admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tokens['admin']}"}, timeout=60)
        for sess in admin.get("/v1/sandbox/sessions").json()["sessions"]:  # only the warm pool stays
            admin.delete(f"/v1/sandbox/sessions/{sess['tenant_id']}/{sess['session_id']}")
        time.sleep(2)
        before = boxes_of(proc.pid)
        rows.append(burst(url, tokens))
        time.sleep(2)  # let the pool refill settle
        after = boxes_of(proc.pid)
        sessions = admin.get("/v1/sandbox/sessions").json()["sessions"]
        print_table("HTTP service on jail (execbox serve subprocess; baselines in-process on jail)", rows)
        print(f"\nburst: 100 concurrent one-shot requests from 10 tenants -> {rows[-1].errors} errors; "
              f"server jail boxes before {before}, after {after} (warm pool); "
              f"sessions left: {len(sessions)}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    finally:
        local.shutdown()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        print(f"server exited with {proc.returncode}; jail boxes left after shutdown: {boxes_of(proc.pid)}")


if __name__ == "__main__":
    main()
