"""Bench: the egress gateway vs. a direct connection, side by side in the same run.

A fake internet (tests/fakenet.py: a network namespace with an HTTP server) is reached
(a) from the host directly (baseline), (b) from a jail box whose policy lists the server's IP,
over the kernel route (boxes/netroute.py: IP allow entries, where the host forwards IPv4) and
(c) from a second box with the same policy and the route turned off
(``EXECBOX_EGRESS_KERNEL_ROUTE=0``), i.e. through the gateway's two TCP connections, which is
also the path of every hostname entry. The same client loop runs in every place:
connect latency = TCP connect + a small HTTP GET answered; throughput = a 10 MB download.
All sides run the client with the box's interpreter, and the downloads alternate in rounds
(``--rounds`` of ``--reps / --rounds`` per side), so a shared machine's drift during the run
lands on every side alike instead of on whichever block ran last.
Targets (issue 14): <= 2 ms added per connection, >= 80 % of direct throughput. Prints only.
The kernel route's CPU is spent in softirq (in whichever process sends), so its per-MB rows show
client and server only; the gateway rows add the gateway thread.

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
from execbox.boxes import netroute  # noqa: E402
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
    ap.add_argument("--rounds", type=int, default=5, help="alternations of direct and boxed downloads")
    args = ap.parse_args()
    with fakenet.serving() as fn:
        run(fn, args)


def run(fn: fakenet.FakeNet, args: argparse.Namespace) -> None:
    p = JailProvider()
    try:
        # two boxes reaching the server by its IP (an IP allow entry): one over the kernel route
        # (where the host forwards IPv4), one with the route turned off, i.e. through the gateway
        p.initialize({"pool_size": 0, "preload": "none", "network": "allowlist",
                      "network_allow": [f"{fn.server_ip}/32:80"]})
        routed_iid = p.create_instance().instance_id
        routed = p._get(routed_iid).box.net.link.conntrack is not None
        os.environ["EXECBOX_EGRESS_KERNEL_ROUTE"] = "0"
        try:
            gw_iid = p.create_instance().instance_id
        finally:
            os.environ.pop("EXECBOX_EGRESS_KERNEL_ROUTE")
        gw_tid = gateway().thread_id()
        client_python = p._settings.runtime.python  # the interpreter the box runs the client with

        def direct(n: int, reps: int) -> dict[str, Any]:
            return json.loads(subprocess.run([client_python, "-I", "-c", CLIENT, fn.server_ip, str(n), str(args.mb),
                                              str(reps)], capture_output=True, text=True, check=True).stdout)

        def boxed(iid: str) -> Any:
            def go(n: int, reps: int) -> dict[str, Any]:
                r = p.execute_code(iid, CLIENT, "python", 600, {"ip": fn.server_ip, "n": n, "mb": args.mb,
                                                                 "reps": reps})
                if r.exit_code != 0:
                    raise SystemExit(r.stderr)
                return r.result
            return go

        sides = {"direct (host)": direct,
                 ("kernel route (jail box)" if routed else "no kernel route here (jail box)"): boxed(routed_iid),
                 "gateway (jail box, route off)": boxed(gw_iid)}
        names = list(sides)
        lat = {k: f(args.n, 0)["lat"] for k, f in sides.items()}
        dl: dict[str, dict[str, Any]] = {k: {"dl": [], "cpu": 0.0, "server": 0.0, "gateway": 0.0} for k in sides}
        rounds = max(1, min(args.rounds, args.reps))
        for i in range(rounds):
            reps = args.reps // rounds + (1 if i < args.reps % rounds else 0)
            for k, f in sides.items():  # alternating: a shared machine's drift lands on every side alike
                s0, g0 = cpu_seconds(fn.server_pid), cpu_seconds(os.getpid(), gw_tid)
                out = f(0, reps)
                dl[k]["dl"] += out["dl"]
                dl[k]["cpu"] += out["cpu"]
                dl[k]["server"] += cpu_seconds(fn.server_pid) - s0
                dl[k]["gateway"] += cpu_seconds(os.getpid(), gw_tid) - g0
        rows = [Row(f"connect+GET {k}", lat[k], sum(lat[k]) / 1000, 1,
                    baseline=None if k == names[0] else f"connect+GET {names[0]}") for k in names]
        print_table(f"egress: connect latency (n={args.n})", rows)
        for r in rows[1:]:
            print(f"added per connection (p50), {r.name[len('connect+GET '):]}: {r.p50 - rows[0].p50:.2f} ms "
                  "(target <= 2 ms)")

        def mbps(runs: list[list[float]], pick: Any) -> float:
            return runs[0][1] / pick(t for t, _ in runs) / 1e6

        for label, pick in (("median", statistics.median), ("best", min)):
            d = mbps(dl[names[0]]["dl"], pick)
            print(f"{args.mb} MB download, {label} of {args.reps}: direct {d:.0f} MB/s; " + "; ".join(
                f"{k} {mbps(dl[k]['dl'], pick):.0f} MB/s = {100 * mbps(dl[k]['dl'], pick) / d:.0f} % of direct"
                for k in names[1:]) + " (target >= 80 %)")
        mb = args.mb * args.reps * 1.048576  # MB (10^6) moved per side
        cores = os.cpu_count() or 1
        for k in names:
            per = {"client": dl[k]["cpu"] / mb, "server": dl[k]["server"] / mb}
            if k.startswith("gateway"):
                per["gateway"] = dl[k]["gateway"] / mb
            ceiling = min(1 / max(per.values()), cores / sum(per.values()))
            print(f"CPU per MB moved (ms), {k}: " + ", ".join(f"{n} {1000 * v:.3f}" for n, v in per.items())
                  + f"; CPU-bound ceiling on {cores} cores {ceiling:.0f} MB/s (kernel forwarding not counted)")
        if not routed:
            print("kernel route: not in use here (" + netroute.available()[1] + ")")
        with open("/proc/loadavg", encoding="ascii") as f:
            print("load average:", " ".join(f.read().split()[:3]))
    finally:
        p.shutdown()


if __name__ == "__main__":
    main()
