"""A/B in one service process, session runs of print(1): levers against GIL contention at c=16.
cur: as committed; nopre: the pre-run OOM counter read taken from the previous run's post-run read;
gc: gc.freeze() after set-up and gen0 threshold 50000; sw: sys.setswitchinterval(0.001);
all: nopre + gc. Service CPU from process_time (this process only). Alternating blocks, rounds."""
import gc
import statistics
import sys
import threading
import time

from execbox.providers.jail import JailProvider

CONCS = [int(c) for c in (sys.argv[1] if len(sys.argv) > 1 else "1,8,16").split(",")]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
RUNS = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
VARIANTS = (sys.argv[4] if len(sys.argv) > 4 else "cur,nopre,gc,sw,all").split(",")
p = JailProvider()
p.initialize({"pool_size": 0, "preload": "none", "max_memory": "256m"})
print("cgroups:", p.applied_limits()["enforced_by"], "python", sys.version.split()[0], flush=True)
ids = [p.create_instance(tenant_id="t", session_id=f"s{i}").instance_id for i in range(max(CONCS))]
boxes = [p._get(i).box for i in ids]
real = {id(b): b.oom_events for b in boxes}


class Cached:
    def __init__(self, read):
        self.read, self.last, self.before = read, None, True

    def __call__(self):
        if self.before:
            self.before = False
            if self.last is not None:
                return self.last
            return self.read()
        self.before = True
        self.last = self.read()
        return self.last


GC0 = gc.get_threshold()


def variant(v):
    for b in boxes:
        b.oom_events = Cached(real[id(b)]) if v in ("nopre", "all") else real[id(b)]
    if v in ("gc", "all"):
        gc.collect()
        gc.freeze()
        gc.set_threshold(50000, GC0[1], GC0[2])
    else:
        gc.unfreeze()
        gc.set_threshold(*GC0)
    sys.setswitchinterval(0.001 if v == "sw" else 0.005)


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
        order = VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]
        for v in order:
            variant(v)
            out.setdefault((conc, v), []).append(block(conc, RUNS if conc > 1 else RUNS // 3))
print(f"{'conc':>4} {'variant':>7} {'runs/s median':>14} {'x cur':>6} {'eff/core':>8} {'svc CPU ms/run':>15}",
      " (each round: runs/s)")
base1 = {v: statistics.median(r for r, _ in out[(1, v)]) for v in VARIANTS} if 1 in CONCS else {}
for (conc, v), rows in out.items():
    rate, cpu = statistics.median(r for r, _ in rows), statistics.median(c for _, c in rows)
    cur = statistics.median(r for r, _ in out[(conc, "cur")]) if (conc, "cur") in out else rate
    eff = f"{rate / (base1[v] * conc) * 100:.0f}%" if v in base1 else "-"
    rounds = " ".join(f"{r:.0f}" for r, _ in rows)
    print(f"{conc:>4} {v:>7} {rate:>14.1f} {rate / cur:>6.2f} {eff:>8} {cpu:>15.3f}  {rounds}", flush=True)
variant("cur")
p.shutdown()
