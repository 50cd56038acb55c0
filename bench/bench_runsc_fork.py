"""Bench: why a session run under runsc slows down with the libraries a box preloads.

A session run forks the agent. Under gVisor (ptrace platform, Debian's runsc) the fork itself is
not the main cost: after a fork, every first write by either process to memory they share copies
it, and the copy costs more the bigger the process is. This bench shows it without execbox's agent:
a probe process in the worker image imports a set of modules (none, numpy, pandas), then times,
per fork,

- ``parent blocked in fork()``;
- ``fork -> child's first statement`` (includes Python's at-fork hooks in the child);
- ``parent's work, child alive``: what the agent does per request (JSON in, JSON out, a few
  small objects) while a forked child shares its memory, against ``parent's work, child gone``
  (the same work before the next fork, the previous child killed and reaped).

Each row has the same probe under runc as its baseline, in the same run. Prints only.

    .venv/bin/python bench/bench_runsc_fork.py [--n 21] [--mods ,numpy,pandas]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _stats import Row, print_table  # noqa: E402
from execbox.boxes import images  # noqa: E402
from execbox.providers.docker import docker_client  # noqa: E402

PROBE = r"""
import gc, json, os, sys, time, struct
for m in [m for m in sys.argv[1].split(",") if m]:
    __import__(m)
gc.collect(); gc.freeze()
P = time.perf_counter
req = json.dumps({"op": "exec", "id": 7, "language": "python", "code": "print(1)\n" * 20})
def work():
    t = P()
    for _ in range(3):
        d = json.loads(req); d["out"] = [str(i) for i in range(50)]; json.dumps(d)
    return (P() - t) * 1e3
r, w = os.pipe()
out = {"fork": [], "child": [], "live": [], "alone": []}
for _ in range(int(sys.argv[2])):
    out["alone"].append(work())
    t0 = P()
    pid = os.fork()
    if pid == 0:
        os.write(w, struct.pack("d", P()))
        time.sleep(30)
        os._exit(0)
    out["fork"].append((P() - t0) * 1e3)
    t1, = struct.unpack("d", os.read(r, 8))
    out["child"].append((t1 - t0) * 1e3)
    out["live"].append(work())
    os.kill(pid, 9); os.waitpid(pid, 0)
print(json.dumps(out))
"""

STAGES = (("fork", "parent blocked in fork()"), ("child", "fork -> child's first statement"),
          ("live", "parent's work, child alive"), ("alone", "parent's work, child gone"))


def probe(client, image: str, runtime: str, mods: str, n: int) -> dict[str, list[float]]:
    raw = client.containers.run(image, ["python3", "-I", "-c", PROBE, mods, str(n)], runtime=runtime,
                                user="1000:1000", network_disabled=True, remove=True, stderr=True)
    return json.loads(raw.decode().strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=21, help="forks per probe")
    ap.add_argument("--mods", default=",numpy,pandas", help="comma-separated import sets; '' is none")
    args = ap.parse_args()
    client = docker_client()
    if "runsc" not in set(client.info().get("Runtimes") or {}):
        print("skipping: runsc is not registered with dockerd")
        return
    spec = images.image_for("python")
    built = images.cached_image(client, spec)
    if built is None:
        print("skipping: the worker image is not built (execbox image build)")
        return
    image = built.id
    rows: list[Row] = []
    for mods in args.mods.split(","):
        label = mods or "none"
        got = {rt: probe(client, image, rt, mods, args.n) for rt in ("runc", "runsc")}
        for key, what in STAGES:
            base = f"runc {label}: {what}"
            for rt in ("runc", "runsc"):
                xs = got[rt][key]
                rows.append(Row(f"{rt} {label}: {what}", xs, sum(xs) / 1000, 1, None if rt == "runc" else base))
    print_table("fork cost by preloaded modules, runsc vs runc (worker image, uid 1000)", rows)


if __name__ == "__main__":
    main()
