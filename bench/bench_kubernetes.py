"""Kubernetes provider: the gateway<->agent channel, measured side by side on the same worker image.

    .venv/bin/python bench/bench_kubernetes.py [--n 100]

No cluster runs here, so the pods come from the in-test API server (tests/integration/kubernetes/
fake_apiserver.py: each pod is a runc container on the Docker bridge, the pod IP is real). Rows:
the Docker provider's attach stream (baseline: one persistent stream, like exec/attach would give
at best), the kubernetes provider's pod-port relay (what the provider uses), and one `docker exec`
per request: a lower bound for the exec API, which on a cluster adds the API server and kubelet
proxies (two more hops, websocket framing) on top. ``files.list`` isolates the channel from the
fork of a run. Samples are interleaved across rows. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.integration.kubernetes.fake_apiserver import FakeApiServer  # noqa: E402

from _stats import Row, print_table  # noqa: E402
from bench_docker import timed  # noqa: E402
from execbox.providers.docker import DockerProvider, docker_client  # noqa: E402
from execbox.providers.kubernetes import KubernetesProvider  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100)
    args = ap.parse_args()
    client = docker_client()
    fake = FakeApiServer(client)
    tmp = tempfile.mkdtemp(prefix="execbox-bench-k8s-")
    dp, kp = DockerProvider(), KubernetesProvider()
    rows: list[Row] = []
    try:
        dp.initialize({"runtime": "runc", "pool_size": 0, "preload": "none"})
        kp.initialize({"kubeconfig": fake.kubeconfig(os.path.join(tmp, "config")), "pool_size": 0,
                       "preload": "none", "agent_secret": "bench-secret-0123456789abcdef", "memory": "512Mi"})
        d = dp.create_instance(tenant_id="bench", session_id="s").instance_id
        k = kp.create_instance(tenant_id="bench", session_id="s").instance_id
        pod = kp._instances[k].box.name
        container = next(c for c in fake.containers() if c.name.endswith(pod))

        def run(p, inst):
            def fn() -> None:
                r = p.execute_code(inst, "print(1)", "python")
                assert r.stdout == "1\n", r.stderr
            return fn

        def ls(p, inst):
            return lambda: p.list_files(inst, ".")

        def exec_per_request() -> None:
            eid = client.api.exec_create(container.id, ["/usr/bin/python3", "-I", "-S", "-c", "print(1)"],
                                         user="1000:1000")["Id"]
            assert client.api.exec_start(eid) == b"1\n"

        # Interleaved: sample i of every row is taken back to back, so load swings on the shared
        # machine hit all rows alike instead of whichever row ran during a spike.
        cases = [("docker attach stream: files.list", ls(dp, d), None),
                 ("pod TCP relay: files.list", ls(kp, k), "docker attach stream: files.list"),
                 ("docker attach stream: run print(1)", run(dp, d), None),
                 ("pod TCP relay: run print(1)", run(kp, k), "docker attach stream: run print(1)"),
                 ("exec per request (docker exec): print(1)", exec_per_request,
                  "docker attach stream: run print(1)")]
        for _, fn, _ in cases:
            for _ in range(5):
                fn()
        samples: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        walls = dict.fromkeys(samples, 0.0)
        errors = dict.fromkeys(samples, 0)
        for i in range(args.n):
            for name, fn, _ in cases:
                if name.startswith("exec per request") and i % 5:
                    continue  # ~200 ms each: a fifth of the samples is plenty
                s, w, e = timed(fn, 1)
                samples[name] += s
                walls[name] += w
                errors[name] += e
        rows += [Row(name, samples[name], walls[name], 1, base, errors[name]) for name, _, base in cases]
    finally:
        kp.shutdown()
        dp.shutdown()
        fake.close()
    print_table("kubernetes provider: gateway<->agent channel (runc, same image)", rows)
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
