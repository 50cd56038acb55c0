"""The HTTP service on the kubernetes provider: sessions, one-shots and /readyz go through real pods."""

from __future__ import annotations

import time

import pytest

from execbox.boxes import k8s_spec as ks
from tests.integration.service.conftest import start_service

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


def test_service_runs_sessions_and_one_shots_in_pods(k8s_provider_factory, fake_apiserver):
    p = k8s_provider_factory(pool_size=1)
    svc = start_service(p)

    def _mine():
        return [n for n in fake_apiserver.pod_names()
                if (fake_apiserver.pod(n) or {}).get("metadata", {}).get("annotations", {}).get(ks.A_OWNER) == p.owner]
    try:
        c = svc.a
        r = c.post("/v1/sandbox/execute", json={"code": "open('n.txt','w').write('7')\nprint('hi')",
                                                "session_id": "k1"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["stdout"] == "hi\n" and body["metadata"]["provider"] == "kubernetes"
        assert body["metadata"]["isolation"] == "container"
        assert c.post("/v1/sandbox/execute", json={"code": "print(open('n.txt').read())",
                                                   "session_id": "k1"}).json()["stdout"] == "7\n"
        one = c.post("/v1/sandbox/execute", json={"code": "echo $((6*7))", "language": "bash"}).json()
        assert one["stdout"] == "42\n", one
        assert c.get("/readyz").status_code == 200
        pods_before = len(_mine())
        assert svc.root.delete("/v1/sandbox/sessions/tenant-a/k1").status_code in (200, 204)
        deadline = time.monotonic() + 15
        while len(_mine()) >= pods_before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_mine()) < pods_before  # the closed session's pod is deleted
    finally:
        svc.stop()
