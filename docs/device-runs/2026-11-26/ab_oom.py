"""A/B in one process: the OOM counter read as open/read/close (old) or one pread on a kept fd (new),
session runs of print(1) at several concurrencies; service CPU from process_time (this process only)."""
import os
import statistics
import sys
import threading
import time
import types

from execbox.boxes import agent_client as ac
from execbox.boxes import cgroups
from execbox.providers.jail import JailProvider


def old_oom(self):
    path = (os.path.join(self.dirs["memory"], "memory.oom_control") if self.layout.version == 1
            else os.path.join(self.dirs[""], "memory.events"))
    try:
        for line in cgroups._read(path).splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
    except OSError:
        return 0
    return 0


CONCS = [int(c) for c in (sys.argv[1] if len(sys.argv) > 1 else "1,8,16").split(",")]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
RUNS = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
p = JailProvider()
p.initialize({"pool_size": 0, "preload": "none", "max_memory": "256m"})
print("cgroups:", p.applied_limits()["enforced_by"], flush=True)
ids = [p.create_instance(tenant_id="t", session_id=f"s{i}").instance_id for i in range(max(CONCS))]
boxes = [p._get(i).box.cgroup for i in ids]


_recv = ac.PipeTransport.recv


def _recv_1mib(self, max_bytes, timeout):
    return _recv(self, 1 << 20, timeout)


def variant(v):
    """old: open/read/close OOM reads, 1 MiB reads; oom: pread, 1 MiB reads; new: pread, 64 KiB reads."""
    for cg in boxes:
        if v == "old":
            cg.oom_kills = types.MethodType(old_oom, cg)
        else:
            cg.__dict__.pop("oom_kills", None)
    ac.PipeTransport.recv = _recv if v == "new" else _recv_1mib


def block(conc, total):
    per = total // conc
    bar = threading.Barrier(conc + 1)

    def work(iid):
        bar.wait()
        for _ in range(per):
            r = p.execute_code(iid, "print(1)", "python")
            assert r.stdout == "1\n"

    ts = [threading.Thread(target=work, args=(ids[i],)) for i in range(conc)]
    for t in ts:
        t.start()
    c0, w0 = time.process_time(), time.perf_counter()
    bar.wait()
    for t in ts:
        t.join()
    w, c = time.perf_counter() - w0, time.process_time() - c0
    return per * conc / w, c / (per * conc) * 1000


for iid in ids:
    for _ in range(50):
        p.execute_code(iid, "print(1)", "python")
out = {}
for conc in CONCS:
    for rnd in range(ROUNDS):
        for v in (("new", "oom", "old") if rnd % 2 == 0 else ("old", "oom", "new")):
            variant(v)
            out.setdefault((conc, v), []).append(block(conc, RUNS if conc > 1 else RUNS // 3))
print(f"{'conc':>4} {'variant':>7} {'runs/s median':>14} {'service CPU ms/run median':>26}  (each round: runs/s)")
for (conc, v), rows in out.items():
    rate, cpu = statistics.median(r for r, _ in rows), statistics.median(c for _, c in rows)
    print(f"{conc:>4} {v:>7} {rate:>14.1f} {cpu:>26.3f}  {' '.join(f'{r:.0f}' for r, _ in rows)}")
variant("new")
p.shutdown()
