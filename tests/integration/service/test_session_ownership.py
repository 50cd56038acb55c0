"""Two services (two databases) sharing one workspaces dir, as several `execbox serve` on one host
do with the default /var/lib/execbox/workspaces: start-up cleanup of one never deletes the other's
workspaces, and equal tenant/session names never share a directory."""

from __future__ import annotations

import os

from execbox.service.config import ServiceSettings

from .conftest import start_service, traversable_tmpdir


def test_services_sharing_a_workspaces_dir_keep_to_their_own_workspaces(jail_provider) -> None:
    shared = os.path.join(traversable_tmpdir("execbox-shared-ws-"), "ws")
    a = start_service(jail_provider, ServiceSettings(workspaces_dir=shared))
    b = None
    try:
        ca = a.a
        r = ca.post("/v1/sandbox/write", json={"session_id": "s1", "path": "f", "content": "from a"})
        assert r.status_code == 200, r.text
        # paused: its box is stopped and the workspace unmounted, as after a restart of A
        assert ca.post("/v1/sandbox/sessions/tenant-a/s1/pause").status_code == 200
        a_ws = os.path.join(a.workspaces, "tenant-a", "s1")
        assert os.path.isdir(a_ws) and a.workspaces.startswith(shared + os.sep)
        os.makedirs(os.path.join(a.workspaces, "tenant-a", "stray"))  # A's own orphan

        b = start_service(jail_provider, ServiceSettings(workspaces_dir=shared))  # B's start-up cleanup
        assert b.workspaces != a.workspaces and b.workspaces.startswith(shared + os.sep)
        assert os.path.isdir(a_ws)  # B has no row for it, and still leaves it alone
        assert os.path.isdir(os.path.join(a.workspaces, "tenant-a", "stray"))  # not B's to judge
        cb = b.a  # the same tenant and session names on B: a workspace of its own
        r = cb.post("/v1/sandbox/execute", json={"session_id": "s1", "code": "import os; print(os.listdir('.'))"})
        assert r.status_code == 200 and "'f'" not in r.json()["stdout"], r.text
        assert cb.post("/v1/sandbox/write", json={"session_id": "s1", "path": "g", "content": "from b"}
                       ).status_code == 200

        r = ca.post("/v1/sandbox/execute", json={"session_id": "s1",
                                                  "code": "import os; print(open('f').read(), os.path.exists('g'))"})
        assert r.status_code == 200 and r.json()["stdout"] == "from a False\n", r.text  # resumed, intact

        # A's start-up cleanup (run again here): its own orphan goes, its session and B's stay
        a.app.state.sessions.adopt_all()
        assert not os.path.exists(os.path.join(a.workspaces, "tenant-a", "stray"))
        assert os.path.isdir(a_ws) and os.path.isdir(os.path.join(b.workspaces, "tenant-a", "s1"))
    finally:
        a.stop()
        if b is not None:
            b.stop()
