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

    def _mine(session: str | None = None):
        out = []
        for n in fake_apiserver.pod_names():
            ann = (fake_apiserver.pod(n) or {}).get("metadata", {}).get("annotations", {})
            if ann.get(ks.A_OWNER) == p.owner and (session is None or ann.get(ks.A_SESSION) == session):
                out.append(n)
        return out
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
        # By the session's own pod, not a count: the pool may be refilling after the one-shot took
        # its pod, and a new pool pod would hide the deleted one from a count.
        [session_pod] = _mine("k1")
        assert svc.root.delete("/v1/sandbox/sessions/tenant-a/k1").status_code in (200, 204)
        deadline = time.monotonic() + 15
        while session_pod in _mine() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert session_pod not in _mine()  # the closed session's pod is deleted
    finally:
        svc.stop()
