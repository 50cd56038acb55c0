"""What the session registry costs: the same SessionManager on the jail provider with its
registry in memory (baseline, nothing survives a restart) and on PostgreSQL, side by side.

Rows: session create + first run (new session id each time: registry create, box start,
registry update, run), a warm run in an existing session (the registry is not touched: last-use
times are flushed by the heartbeat), and the registry's own share of a create (reserve the row
under the quota lock, then write the box handle) without the box start's noise.
The last row is the create transaction sent one statement per round trip (BEGIN, lock, count,
insert, COMMIT) instead of in one psycopg pipeline: what the pipeline saves, side by side.
Target (issue 17): <= 3 ms added at p50. Starts a throw-away PostgreSQL cluster (initdb) unless
--pg URL is given. Usage: .venv/bin/python bench/bench_sessions.py [--quick] [--pg URL]
"""

from __future__ import annotations

import argparse
import glob
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _stats import Row, measure, print_table  # noqa: E402


def start_pg(base: str, fsync: bool) -> tuple[str, list[str]]:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        sys.exit("PostgreSQL server binaries not found (Debian package postgresql); or pass --pg URL")
    bindir = os.path.dirname(found[-1])
    data = os.path.join(base, "pg")
    as_user: dict[str, str] = {}
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
        as_user = {"user": "postgres", "group": "postgres"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "LANG": "C.UTF-8"}
    subprocess.run([f"{bindir}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync"],
                   check=True, capture_output=True, env=env, cwd=base, **as_user)
    options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync={'on' if fsync else 'off'}"
    subprocess.run([f"{bindir}/pg_ctl", "-D", data, "-o", options,
                    "-l", os.path.join(base, "pg.log"), "-w", "start"], check=True, capture_output=True, env=env,
                   cwd=base, **as_user)
    stop = [f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"]
    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", stop


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--pg", default="")
    ap.add_argument("--fsync", choices=("on", "off"), default="on",
                    help="fsync of the throw-away cluster: on (a real server's default; every commit waits for "
                         "the disk) or off (isolates the round trips from the disk)")
    args = ap.parse_args()
    n_create, n_warm, n_reg = (15, 100, 200) if args.quick else (40, 400, 1000)

    from execbox.providers.jail import JailProvider
    from execbox.service.config import ServiceSettings
    from execbox.service.sessions import MemoryRegistry, SessionManager
    from execbox.service.store import open_store

    base = tempfile.mkdtemp(prefix="execbox-bench-sessions-")
    os.chmod(base, 0o711)
    stop_pg: list[str] | None = None
    url = args.pg
    if not url:
        url, stop_pg = start_pg(base, args.fsync == "on")
    prov = JailProvider()
    prov.initialize({"pool_size": 2, "max_memory": "256m", "preload": "none"})
    settings = ServiceSettings(max_sessions=10_000, tenant_max_sessions=10_000, replica_id="bench")
    store = open_store(data_dir=os.path.join(base, "data"), url=url)

    class Holder:
        def current(self):  # noqa: ANN202
            return prov

        def candidates(self):  # noqa: ANN202
            return [prov]

    managers = {
        "memory": SessionManager(Holder(), settings, os.path.join(base, "ws-mem"), registry=MemoryRegistry()),
        "postgres": SessionManager(Holder(), settings, os.path.join(base, "ws-pg"), registry=store.sessions),
    }
    rows: list[Row] = []
    merged: dict[str, Row] = {}

    def add(row: Row) -> None:
        """Rounds alternate memory and PostgreSQL so drifting machine load hits both alike."""
        old = merged.get(row.name)
        if old is None:
            merged[row.name] = row
            rows.append(row)
        else:
            old.samples_ms += row.samples_ms
            old.wall_s += row.wall_s
            old.errors += row.errors

    rounds = 4
    try:
        for _ in range(rounds):
            for kind, mgr in managers.items():

                def base_of(name: str, kind: str = kind) -> str | None:
                    return None if kind == "memory" else f"{name} [memory]"

                seq = itertools.count()
                made: list[str] = []

                def create_and_run(mgr=mgr, seq=seq, made=made) -> None:
                    sid = f"c{next(seq)}-{uuid.uuid4().hex[:6]}"
                    made.append(sid)
                    with mgr.session("bench", sid) as s:
                        s.provider.execute_code(s.instance_id, "x = 1", "python", timeout=10)

                add(measure(f"create + first run [{kind}]", create_and_run, n=n_create // rounds, warmup=1,
                            baseline=base_of("create + first run")))
                for sid in made:
                    mgr.destroy("bench", sid)

                def warm(mgr=mgr) -> None:
                    with mgr.session("bench", "warm") as s:
                        s.provider.execute_code(s.instance_id, "x = 1", "python", timeout=10)

                add(measure(f"warm run [{kind}]", warm, n=n_warm // rounds, warmup=3, baseline=base_of("warm run")))
                mgr.heartbeat()

                reg = mgr.registry
                written: list[str] = []

                def create_path(reg=reg, written=written) -> None:
                    """The registry's share of a session create: reserve (quota), then the box handle."""
                    sid = uuid.uuid4().hex[:12]
                    written.append(sid)
                    reg.create("bench", sid, provider="jail", runtime="python", owner="bench", lease_ttl=15,
                               tenant_limit=100_000, global_limit=100_000)
                    reg.update("bench", sid, state="running", box_handle={"instance_id": "i"})

                add(measure(f"registry create + update [{kind}]", create_path, n=n_reg // rounds, warmup=3,
                            baseline=base_of("registry create + update")))
                if getattr(reg, "_pipeline", False):  # the create transaction without psycopg's pipeline
                    reg._pipeline = False  # type: ignore[attr-defined]
                    try:
                        add(measure("registry create + update [postgres, no pipeline]", create_path,
                                    n=n_reg // rounds, warmup=3, baseline="registry create + update [postgres]"))
                    finally:
                        reg._pipeline = True  # type: ignore[attr-defined]
                for sid in written:
                    reg.delete("bench", sid)
        for mgr in managers.values():
            mgr.destroy("bench", "warm")
    finally:
        for mgr in managers.values():
            mgr.shutdown()
        prov.shutdown()
        store.close()
        if stop_pg:
            subprocess.run(stop_pg, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    print_table(f"session registry: PostgreSQL (fsync {args.fsync if not args.pg else 'server'}) vs in memory "
                "(jail provider, same process)", rows)
    by = {r.name: r for r in rows}
    for what in ("create + first run", "warm run", "registry create + update"):
        added = by[f"{what} [postgres]"].p50 - by[f"{what} [memory]"].p50
        print(f"{what}: PostgreSQL registry adds {added:+.2f} ms at p50 (target <= 3 ms)")
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
