"""Bench: the egress gateway vs. a direct connection, side by side in the same run.

A fake internet (tests/fakenet.py: a network namespace with an HTTP server) is reached
(a) from the host directly (baseline) and (b) from inside a jail box whose only way out is the
gateway (allowlist with the server's address). The same client loop runs in both places:
connect latency = TCP connect + a small HTTP GET answered; throughput = a 10 MB download.
Both sides run the client with the box's interpreter, and the downloads alternate in rounds
(``--rounds`` of ``--reps / --rounds`` per side), so a shared machine's drift during the run
lands on both sides alike instead of on whichever block ran second.
Targets (issue 14): <= 2 ms added per connection, >= 80 % of direct throughput. Prints only.

    .venv/bin/python bench/bench_egress.py [-n 200] [--mb 10] [--reps 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests import fakenet  # noqa: E402

from _stats import Row, print_table  # noqa: E402
from execbox.egress.gateway import gateway  # noqa: E402
from execbox.providers.jail import JailProvider  # noqa: E402


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """CPU time of one thread (ns resolution), or of a whole process with its ended threads (ticks)."""
    if tid:
        with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
            return int(f.read().split()[0]) / 1e9
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

CLIENT = r"""
import json, socket, sys, time
def get(ip, path, want_all):
    s = socket.create_connection((ip, 80), timeout=30)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    n = 0
    while True:
        b = s.recv(1 << 16)
        if not b: break
        n += len(b)
        if not want_all and b"\r\n\r\n" in b and n > 0: break
    s.close()
    return n
def main(ip, n, mb, reps):
    lat = []
    for _ in range(n):
        t = time.perf_counter(); get(ip, "/ping", False); lat.append((time.perf_counter() - t) * 1000)
    runs = []
    c0 = time.process_time()
    for _ in range(reps):
        t = time.perf_counter()
        got = get(ip, f"/bytes/{mb * 1024 * 1024}", True)
        runs.append((time.perf_counter() - t, got))
    return {"lat": lat, "dl": runs, "cpu": time.process_time() - c0}
if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--mb", type=int, default=10)
    ap.add_argument("--reps", type=int, default=20, help="downloads per side (median and best are shown)")
    ap.add_argument("--rounds", type=int, default=5, help="alternations of direct and gateway downloads")
    args = ap.parse_args()
    fn = fakenet.start()
    p = JailProvider()
    try:
        p.initialize({"pool_size": 0, "preload": "none", "network": "allowlist",
                      "network_allow": [f"{fn.server_ip}/32:80"]})
        iid = p.create_instance().instance_id
        gw_tid = gateway().thread_id()

        client_python = p._settings.runtime.python  # the interpreter the box runs the client with

        def direct(n: int, reps: int) -> dict[str, Any]:
            return json.loads(subprocess.run([client_python, "-I", "-c", CLIENT, fn.server_ip, str(n), str(args.mb),
                                              str(reps)], capture_output=True, text=True, check=True).stdout)

        def boxed(n: int, reps: int) -> dict[str, Any]:
            r = p.execute_code(iid, CLIENT, "python", 600, {"ip": fn.server_ip, "n": n, "mb": args.mb, "reps": reps})
            if r.exit_code != 0:
                raise SystemExit(r.stderr)
            return r.result

        def measured(run: Any, reps: int, side: dict[str, Any]) -> None:
            """Add the run's downloads and client CPU, and the fake server's and gateway thread's CPU."""
            s0, g0 = cpu_seconds(fn.server_pid), cpu_seconds(os.getpid(), gw_tid)
            out = run(0, reps)
            side["dl"] += out["dl"]
            side["cpu"] += out["cpu"]
            side["server"] += cpu_seconds(fn.server_pid) - s0
            side["gateway"] += cpu_seconds(os.getpid(), gw_tid) - g0

        host, box = direct(args.n, 0), boxed(args.n, 0)
        host_dl: dict[str, Any] = {"dl": [], "cpu": 0.0, "server": 0.0, "gateway": 0.0}
        box_dl: dict[str, Any] = {"dl": [], "cpu": 0.0, "server": 0.0, "gateway": 0.0}
        rounds = max(1, min(args.rounds, args.reps))
        for i in range(rounds):
            reps = args.reps // rounds + (1 if i < args.reps % rounds else 0)
            measured(direct, reps, host_dl)
            measured(boxed, reps, box_dl)
        host_srv, box_srv, box_gw = host_dl["server"], box_dl["server"], box_dl["gateway"]
        rows = [Row("connect+GET direct (host)", host["lat"], sum(host["lat"]) / 1000, 1),
                Row("connect+GET via gateway (jail box)", box["lat"], sum(box["lat"]) / 1000, 1,
                    baseline="connect+GET direct (host)")]
        print_table(f"egress gateway: connect latency (n={args.n})", rows)
        print(f"added per connection (p50): {rows[1].p50 - rows[0].p50:.2f} ms (target <= 2 ms)")

        def mbps(runs: list[list[float]], pick: Any) -> float:
            return runs[0][1] / pick(t for t, _ in runs) / 1e6

        for label, pick in (("median", statistics.median), ("best", min)):
            d, g = mbps(host_dl["dl"], pick), mbps(box_dl["dl"], pick)
            print(f"{args.mb} MB download, {label} of {args.reps}: direct {d:.0f} MB/s, via gateway {g:.0f} MB/s "
                  f"= {100 * g / d:.0f} % of direct (target >= 80 %)")
        mb = args.mb * args.reps * 1.048576  # MB (10^6) moved per side
        per = {"client": host_dl["cpu"] / mb, "server": host_srv / mb}
        via = {"client": box_dl["cpu"] / mb, "gateway": box_gw / mb, "server": box_srv / mb}
        print("CPU per MB moved (ms): direct " + ", ".join(f"{k} {1000 * v:.3f}" for k, v in per.items())
              + "; via gateway " + ", ".join(f"{k} {1000 * v:.3f}" for k, v in via.items()))
        cores = os.cpu_count() or 1
        ceiling = min(1 / max(per.values()), cores / sum(per.values()))
        ceiling_gw = min(1 / max(via.values()), cores / sum(via.values()))
        print(f"CPU-bound ceiling on {cores} cores (each process single-threaded): direct {ceiling:.0f} MB/s, "
              f"via gateway {ceiling_gw:.0f} MB/s = {100 * ceiling_gw / ceiling:.0f} %")
        with open("/proc/loadavg", encoding="ascii") as f:
            print("load average:", " ".join(f.read().split()[:3]))
    finally:
        p.shutdown()
        fn.close()


if __name__ == "__main__":
    main()
