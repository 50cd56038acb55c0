"""Bench: the cost of the executor HTTP hop. `def main(n): return n + 1` run one-shot

  - directly on the provider (the baseline: what `/run` does inside the server),
  - through POST /run on a real uvicorn executor on loopback (raw httpx),
  - through the `self_managed` provider against that executor (what a remote execbox pays),

all measured side by side in one process; the server runs jail when available, else local.

    .venv/bin/python bench/bench_remote.py [-n 200] [--provider jail|local]
"""

from __future__ import annotations

import argparse
import base64
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import httpx  # noqa: E402
from tests.integration.remote.conftest import server_provider_name  # noqa: E402
from tests.unit.remote.http_server import ThreadedServer  # noqa: E402

from _stats import measure, print_table  # noqa: E402
from execbox.providers.registry import create_provider  # noqa: E402
from execbox.providers.self_managed import SelfManagedProvider  # noqa: E402
from execbox.service.routes.executor_compat import ExecutorAuth, create_executor_app  # noqa: E402

CODE = "def main(n):\n    return n + 1\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--provider", default=None)
    args = ap.parse_args()
    n = args.n
    name = args.provider or server_provider_name()
    provider = create_provider(name, {"pool_size": 4})
    srv = ThreadedServer(create_executor_app(provider, auth=ExecutorAuth(open=True), owns_provider=False)).start()
    client = httpx.Client(base_url=srv.url, timeout=60)
    remote = SelfManagedProvider()
    remote.initialize({"endpoint": srv.url, "pool_size": 8})
    rows = []
    base = f"baseline: {name} one-shot in process"
    try:
        def direct() -> None:
            inst = provider.create_instance("python")
            try:
                r = provider.execute_code(inst.instance_id, CODE, "python", 10, {"n": 1}, inline_artifacts=True)
            finally:
                provider.destroy_instance(inst.instance_id)
            assert r.result == 2, r

        body = {"code_b64": base64.b64encode(CODE.encode()).decode(), "language": "python", "arguments": {"n": 1}}

        def http_run() -> None:
            r = client.post("/run", json=body)
            assert r.status_code == 200 and r.json()["result"]["value"] == 2, r.text

        def via_self_managed() -> None:
            inst = remote.create_instance("python")
            try:
                r = remote.execute_code(inst.instance_id, CODE, "python", 10, {"n": 1})
            finally:
                remote.destroy_instance(inst.instance_id)
            assert r.result == 2, r

        rows.append(measure(base, direct, n=n))
        rows.append(measure(f"POST /run ({name}, raw httpx)", http_run, n=n, baseline=base))
        rows.append(measure(f"self_managed -> /run ({name})", via_self_managed, n=n, baseline=base))
        rows.append(measure(f"{base} x4", direct, n=n, concurrency=4))
        rows.append(measure(f"POST /run ({name}) x4", http_run, n=n, concurrency=4, baseline=f"{base} x4"))
        print_table(f"executor /run overhead (n={n}, provider={name}, isolation={provider.isolation.value})", rows)
    finally:
        remote.shutdown()
        client.close()
        srv.stop()
        provider.shutdown()


if __name__ == "__main__":
    main()
