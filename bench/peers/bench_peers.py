"""Peers side by side: execbox (jail, Docker runc/runsc) vs llm-sandbox (PyPI, Docker backend) and a raw
docker-py ``exec_run`` baseline, measured in the same run on the same machine.

Two scenarios, each as p50 / p95 / throughput with ratios (execbox vs each peer):
- session run: ``print(1)`` in an already-open box/session;
- sustained one-shot: create -> run ``print(1)`` -> destroy, back to back.

Everything uses images already built locally (the suite's execbox/python image); nothing is pulled.
llm-sandbox is optional (``pip install 'llm-sandbox[docker]'``); when it is missing or cannot start
offline the row says why and the docker-py baseline still runs. Prints tables only, asserts nothing.

    .venv/bin/python bench/peers/bench_peers.py [--n 50] [--oneshot-n 10] [--image execbox/python:latest]
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _stats import Row, measure  # noqa: E402

PRINT1 = "print(1)"


def table(title: str, rows: list[Row], subject_prefix: str = "execbox") -> None:
    """One table: every execbox row against every peer row (p50 ratio, lower is better for execbox)."""
    peers = [r for r in rows if not r.name.startswith(subject_prefix)]
    print(f"\n{title}")
    header = f"{'scenario':<40} {'n':>4} {'p50 ms':>9} {'p95 ms':>9} {'ops/s':>8} {'err':>4}  p50 ratio vs peers"
    print(header)
    print("-" * len(header))
    for r in rows:
        ratios = ""
        if r.name.startswith(subject_prefix) and r.samples_ms:
            ratios = ", ".join(f"x{r.p50 / p.p50:.2f} {p.name}" for p in peers if p.samples_ms and p.p50)
        if not r.samples_ms:
            print(f"{r.name:<40} {'-':>4}  not measured")
            continue
        print(f"{r.name:<40} {len(r.samples_ms):>4} {r.p50:>9.2f} {r.p95:>9.2f} {r.throughput:>8.1f} "
              f"{r.errors:>4}  {ratios}")


def skipped(name: str, why: str) -> list[Row]:
    """Empty session and one-shot rows for a peer that cannot run here, with the reason printed."""
    print(f"  {name}: not measured: {why}", file=sys.stderr)
    return [Row(f"{name} (session)", [], 0.0, 1), Row(f"{name} (one-shot)", [], 0.0, 1)]


PEER_TAG = "execbox-bench-peer:latest"


def peer_image(base: str) -> str:
    """The peers' image: ``base`` plus a ``python`` name (llm-sandbox execs ``python``; the suite's
    image only has ``python3``). Built locally from ``base``; nothing is pulled."""
    import io

    import docker

    client = docker.from_env()
    dockerfile = (f"FROM {base}\nUSER root\n"
                  "RUN ln -sf \"$(command -v python3)\" /usr/local/bin/python\n")
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=PEER_TAG, pull=False, rm=True)
    return PEER_TAG


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


# ---- raw docker-py baseline ---------------------------------------------------------------------
def docker_py_rows(image: str, n: int, oneshot_n: int) -> list[Row]:
    import docker

    client = docker.from_env()
    name = "docker-py exec_run"
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return skipped(name, f"image {image} not built locally (make install builds it)")
    label = {"execbox-bench-peer": str(os.getpid())}
    for old in client.containers.list(all=True, filters={"label": "execbox-bench-peer"}):
        if not _alive(int(old.labels.get("execbox-bench-peer", "0") or 0)):
            old.remove(force=True)  # left by a bench run that was killed
    c = client.containers.run(image, ["sleep", "infinity"], detach=True, network_disabled=True,
                              entrypoint=[], labels=label, auto_remove=False)
    try:
        def run_in(cont) -> None:
            res = cont.exec_run(["python3", "-c", PRINT1])
            if res.exit_code != 0:
                raise RuntimeError(res.output[-200:])

        session = measure(f"{name} (session)", lambda: run_in(c), n=n, warmup=3)
    finally:
        c.remove(force=True)

    def oneshot() -> None:
        cont = client.containers.run(image, ["sleep", "infinity"], detach=True, network_disabled=True,
                                     entrypoint=[], labels=label)
        try:
            run_in(cont)
        finally:
            cont.remove(force=True)

    shot = measure(f"{name} (one-shot)", oneshot, n=oneshot_n, warmup=1)
    return [session, shot]


# ---- llm-sandbox --------------------------------------------------------------------------------
def _llm_session(image: str):
    from llm_sandbox import SandboxSession

    wanted = {"lang": "python", "image": image, "keep_template": True, "verbose": False,
              "skip_environment_setup": True, "commit_container": False}
    accepted = inspect.signature(SandboxSession).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        wanted = {k: v for k, v in wanted.items() if k in accepted}
    return SandboxSession(**wanted)


def llm_sandbox_rows(image: str, n: int, oneshot_n: int) -> list[Row]:
    name = "llm-sandbox docker"
    try:
        import llm_sandbox  # noqa: F401
    except ImportError:
        return skipped(name, "llm-sandbox not installed (pip install 'llm-sandbox[docker]')")
    try:
        s = _llm_session(image)
        s.open()
    except Exception as e:  # noqa: BLE001 - the reason is printed and the peer row left empty
        return skipped(name, f"cannot open a session offline: {type(e).__name__}: {str(e)[:200]}")

    def run_in(sess) -> None:
        out = sess.run(PRINT1)
        if getattr(out, "exit_code", 0) != 0 or "1" not in (getattr(out, "stdout", "") or ""):
            raise RuntimeError(str(out)[:200])

    try:
        session = measure(f"{name} (session)", lambda: run_in(s), n=n, warmup=2)
    finally:
        s.close()

    def oneshot() -> None:
        sess = _llm_session(image)
        sess.open()
        try:
            run_in(sess)
        finally:
            sess.close()

    shot = measure(f"{name} (one-shot)", oneshot, n=oneshot_n, warmup=1)
    return [session, shot]


# ---- execbox ------------------------------------------------------------------------------------
def provider_rows(label: str, make: Callable[[], object], n: int, oneshot_n: int) -> list[Row]:
    try:
        p = make()
    except Exception as e:  # noqa: BLE001 - an unavailable backend is reported, not fatal
        return skipped(f"execbox {label}", f"{type(e).__name__}: {e}")

    def run_ok(iid: str) -> None:
        r = p.execute_code(iid, PRINT1, "python", 60)
        if r.exit_code != 0 or r.stdout != "1\n":
            raise RuntimeError(r.stderr[-200:])

    try:
        iid = p.create_instance(session_id="peers").instance_id
        session = measure(f"execbox {label} (session)", lambda: run_ok(iid), n=n, warmup=3)
        p.destroy_instance(iid)

        def oneshot() -> None:
            inst = p.create_instance()
            try:
                run_ok(inst.instance_id)
            finally:
                p.destroy_instance(inst.instance_id)

        shot = measure(f"execbox {label} (one-shot)", oneshot, n=oneshot_n, warmup=0)
    finally:
        p.shutdown()
    return [session, shot]


def make_jail():
    from execbox.providers.jail import JailProvider

    ok, reason = JailProvider.availability()
    if not ok:
        raise RuntimeError(reason)
    p = JailProvider()
    p.initialize({"max_memory": "512m", "disk_quota_mb": 64, "cpus": 1.0, "pool_size": 4, "preload": "none"})
    return p


def make_docker(runtime: str):
    def make():
        from execbox.providers.docker import DockerProvider

        p = DockerProvider()
        p.initialize({"runtime": runtime, "pool_size": 2, "pool_wait": 300, "preload": "none"})
        return p
    return make


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--oneshot-n", type=int, default=10)
    ap.add_argument("--image", default="execbox/python:latest", help="locally built image for the peers")
    ap.add_argument("--runtimes", default="runc,runsc", help="execbox Docker runtimes to include")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    rows: list[Row] = []
    rows += provider_rows("jail", make_jail, args.n, args.oneshot_n)
    for rt in [r for r in args.runtimes.split(",") if r]:
        rows += provider_rows(f"docker {rt}", make_docker(rt), args.n, args.oneshot_n)
    try:
        image = peer_image(args.image)
    except Exception as e:  # noqa: BLE001 - no Docker or no base image: the peers say why
        rows += skipped("llm-sandbox docker", f"peer image not built: {e}")
        rows += skipped("docker-py exec_run", f"peer image not built: {e}")
    else:
        rows += llm_sandbox_rows(image, args.n, args.oneshot_n)
        rows += docker_py_rows(image, args.n, args.oneshot_n)
    table("session run print(1): execbox vs peers", [r for r in rows if "(session)" in r.name])
    table("sustained one-shot create+run+destroy: execbox vs peers", [r for r in rows if "(one-shot)" in r.name])
    print(f"\nhost: {os.cpu_count()} cpus, load {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
