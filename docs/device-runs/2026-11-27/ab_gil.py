"""A/B in one service process, session runs of print(1): the GIL over the run's fast syscalls.

Each of a session run's syscalls (write of the request, poll, read of the reply, two preads of the
OOM counter) gives the interpreter lock up and takes it back; with sixteen threads, taking it back
after a 3 us syscall can mean a long wait. Variants:
cur:   as committed;
held:  the three syscalls that cannot block here (the pread of the cgroup file, the write of a
       small request into a pipe the agent drains, the read after poll said readable) made through
       ctypes.PyDLL, which keeps the lock: one hand-over per run (the poll) instead of five;
nopre: the pre-run OOM read taken from the previous run's post-run read (ab_levers.py);
all:   held + nopre.
Service CPU from process_time (this process only). Alternating blocks, rounds, medians."""
import ctypes
import os
import statistics
import sys
import threading
import time

from execbox.boxes import agent_client, oom_counter
from execbox.providers.jail import JailProvider

CONCS = [int(c) for c in (sys.argv[1] if len(sys.argv) > 1 else "1,8,16").split(",")]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
RUNS = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
VARIANTS = (sys.argv[4] if len(sys.argv) > 4 else "cur,held,nopre,all").split(",")

libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the call keeps the GIL
for name, args in (("pread", [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]),
                   ("read", [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]),
                   ("write", [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t])):
    getattr(libc, name).argtypes = args
    getattr(libc, name).restype = ctypes.c_ssize_t
_local = threading.local()


def _buf(size):
    b = getattr(_local, "b", None)
    if b is None or len(b) < size:
        b = _local.b = ctypes.create_string_buffer(size)
    return b


Orig = {"read_text": oom_counter.OomCounter.read_text, "send": agent_client.PipeTransport.send,
        "recv": agent_client.PipeTransport.recv}


def held_read_text(self):
    with self._lock:
        if self._fd == oom_counter._CLOSED:
            return None
        if self._fd < 0:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
        b = _buf(65536)
        n = libc.pread(self._fd, b, 4096, 0)
        return None if n < 0 else b.raw[:n].decode("ascii")


def held_send(self, data):
    if len(data) > 4096:  # could fill the pipe and block with the lock held
        return Orig["send"](self, data)
    n = libc.write(self.write_fd, data, len(data))
    if n < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    if n < len(data):
        Orig["send"](self, data[n:])


def held_recv(self, max_bytes, timeout):
    if not agent_client.wait_readable(self.read_fd, timeout):
        raise TimeoutError
    b = _buf(max_bytes)
    n = libc.read(self.read_fd, b, max_bytes)
    if n < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return b.raw[:n]


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


def variant(v):
    held = v in ("held", "all")
    oom_counter.OomCounter.read_text = held_read_text if held else Orig["read_text"]
    agent_client.PipeTransport.send = held_send if held else Orig["send"]
    agent_client.PipeTransport.recv = held_recv if held else Orig["recv"]
    for b in boxes:
        b.oom_events = Cached(real[id(b)]) if v in ("nopre", "all") else real[id(b)]


def block(conc, total):
    per = total // conc
    bar = threading.Barrier(conc + 1)

    def work(iid):
        bar.wait()
        for _ in range(per):
            r = p.execute_code(iid, "print(1)", "python")
            assert r.stdout == "1\n", r

    ts = [threading.Thread(target=work, args=(ids[i],)) for i in range(conc)]
    for t in ts:
        t.start()
    c0, w0 = time.process_time(), time.perf_counter()
    bar.wait()
    for t in ts:
        t.join()
    w, c = time.perf_counter() - w0, time.process_time() - c0
    return per * conc / w, c / (per * conc) * 1000


for v in VARIANTS:  # each variant works before anything is timed
    variant(v)
    for iid in ids:
        for _ in range(20):
            assert p.execute_code(iid, "print(1)", "python").stdout == "1\n"
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
