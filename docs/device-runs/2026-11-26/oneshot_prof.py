"""Sustained one-shots at concurrency C in one service process, with py-spy recording twice:
--idle (where the request threads wait) and --gil (what holds the interpreter), then without it.

    python3 oneshot_prof.py OUT N C        (py-spy's static binary in bin/ beside this file)
"""

import os
import subprocess
import sys
import threading
import time

from execbox.providers.jail import JailProvider

OUT, N, C = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
SPY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "py-spy")
p = JailProvider()
p.initialize({"pool_size": 0, "preload": "none"})


def one() -> None:
    i = p.create_instance(tenant_id="t")
    r = p.execute_code(i.instance_id, "print(1)", "python")
    assert r.stdout == "1\n", r.stderr
    p.destroy_instance(i.instance_id)


def worker() -> None:
    for _ in range(N // C):
        one()


for _ in range(30):
    one()
for mode in ("--idle", "--gil", None):
    spy = None
    if mode:
        spy = subprocess.Popen([SPY, "record", "-p", str(os.getpid()), "-o", f"{OUT}/spy{mode}.txt", "-f", "raw",
                                "-r", "200", "-d", "4", mode], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
    c0, t0 = time.process_time(), time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(C)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"{mode or 'no profiler'}: {N} one-shots c={C}: {N / wall:.1f}/s, "
          f"service CPU {1000 * cpu / N:.2f} ms each", flush=True)
    if spy:
        spy.wait()
p.shutdown()
