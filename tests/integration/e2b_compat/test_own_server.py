"""E2B SDK tests that need an `execbox serve` of their own: one restarted under the SDK's feet
(sandboxes live in the store: they survive it), one with the provider's code policy on."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from tests.serve_process import RUNTIME, require_jail_runtime, serve

e2b = pytest.importorskip("e2b")
ci = pytest.importorskip("e2b_code_interpreter")

DOMAIN = "sandboxes.example"


@pytest.fixture
def data_dir() -> Iterator[tuple[str, str, str]]:
    """(data dir, admin token, tenant token) for servers started on it."""
    from execbox.service.store import open_store

    require_jail_runtime(RUNTIME)
    path = tempfile.mkdtemp(prefix="execbox-e2b-own-")
    with open_store(data_dir=path) as store:
        _, admin = store.tokens.create("default", "admin", "e2b own server")
        _, tenant = store.tokens.create("alpha", "tenant", "e2b own server")
    yield path, admin, tenant
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _server(path: str, admin: str, tenant: str, monkeypatch: pytest.MonkeyPatch,
            **config: object) -> Iterator[str]:
    with serve(path, drop_env=("SANDBOX_", "E2B_"), env={"EXECBOX_E2B_DOMAIN": DOMAIN}) as (url, _log):
        if config:
            r = httpx.post(f"{url}/api/admin/sandbox/config", headers={"Authorization": f"Bearer {admin}"},
                           timeout=120, json={"provider_type": "jail", "set_active": True,
                                              "config": {"runtime": RUNTIME, "pool_size": 0, **config}})
            assert r.status_code == 200, r.text
        monkeypatch.setenv("E2B_API_URL", url)
        monkeypatch.setenv("E2B_SANDBOX_URL", url)
        monkeypatch.setenv("E2B_API_KEY", tenant)
        yield url


def test_a_sandbox_survives_a_restart_of_the_service(data_dir, monkeypatch) -> None:
    path, admin, tenant = data_dir
    with _server(path, admin, tenant, monkeypatch, max_memory="512m"):
        sbx = ci.Sandbox.create(timeout=600, metadata={"who": "restart"}, envs={"SECRET_TOKEN": "s3cr3t-value"})
        sid, token = sbx.sandbox_id, sbx._envd_access_token
        sbx.files.write("/home/user/kept.txt", "before the restart")
        before = sbx.get_info()
    with open(f"{path}/execbox.db", "rb") as f:
        assert b"s3cr3t-value" not in f.read()  # the sandbox's env vars are stored encrypted
    with _server(path, admin, tenant, monkeypatch) as url:
        again = ci.Sandbox.connect(sid)
        assert again._envd_access_token == token  # the same token: derived, never stored
        info = again.get_info()
        assert (info.metadata, info.end_at) == ({"who": "restart"}, before.end_at)
        assert again.files.read("/home/user/kept.txt") == "before the restart"
        assert again.commands.run("echo $SECRET_TOKEN").stdout == "s3cr3t-value\n"
        assert again.run_code("6 * 7").text == "42"
        r = httpx.get(f"{url}/health", headers={"Host": f"49983-{sid}.{DOMAIN}", "X-Access-Token": token})
        assert r.status_code in (200, 204), r.text  # the old token still opens the sandbox URL
        listed = e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"who": "restart"})).next_items()
        assert [s.sandbox_id for s in listed] == [sid]
        assert again.kill() is True
        assert e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"who": "restart"})).next_items() == []


def test_the_providers_code_policy_judges_the_users_cell(data_dir, monkeypatch) -> None:
    """The cell reaches the box wrapped in a driver program (cells.py); the provider's AST policy
    must judge what the user wrote, not the driver."""
    path, admin, tenant = data_dir
    with _server(path, admin, tenant, monkeypatch, enable_ast_analysis=True, blocked_imports=["socket"]):
        sbx = ci.Sandbox.create(timeout=120)
        try:
            assert sbx.run_code("x = 20\nx + 1").text == "21"  # the driver itself passes the policy
            ex = sbx.run_code("import socket\nsocket.gethostname()")
            assert ex.error is not None and "socket" in ex.error.value and ex.text is None, ex
        finally:
            sbx.kill()
