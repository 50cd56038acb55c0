"""The one real `execbox serve` session fixture (jail provider, `sci` runtime with matplotlib).

Used by the E2B SDK tests (tests/integration/e2b_compat) and the conformance suite (self_managed
with api execbox, e2b against execbox's E2B endpoint). Registered once from tests/conftest.py
(``pytest_plugins``), so one server serves every suite in a session. Two tenants' tokens and an
admin token are made before the server starts.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.serve_process import RUNTIME, require_jail_runtime, serve

SANDBOX_DOMAIN = "sandboxes.example"  # {port}-{id}.sandboxes.example routes to a sandbox


@dataclass
class Server:
    url: str
    admin_token: str
    token_a: str  # tenant "alpha"
    token_b: str  # tenant "beta"
    log: Path


@pytest.fixture(scope="session")
def e2b_server() -> Iterator[Server]:
    from execbox.service.store import open_store

    require_jail_runtime(RUNTIME)
    data_dir = tempfile.mkdtemp(prefix="execbox-e2b-")
    store = open_store(data_dir=data_dir)
    _, admin = store.tokens.create("default", "admin", "e2b tests")
    _, token_a = store.tokens.create("alpha", "tenant", "e2b tests alpha")
    _, token_b = store.tokens.create("beta", "tenant", "e2b tests beta")
    close = getattr(store, "close", None)
    if close:
        close()
    try:
        with serve(data_dir, drop_env=("SANDBOX_", "E2B_"), env={"EXECBOX_E2B_DOMAIN": SANDBOX_DOMAIN}) as (url, log):
            r = httpx.post(f"{url}/api/admin/sandbox/config", headers={"Authorization": f"Bearer {admin}"},
                           timeout=120, json={"provider_type": "jail", "set_active": True,
                                              "config": {"runtime": RUNTIME, "max_memory": "512m", "pool_size": 1}})
            assert r.status_code == 200, r.text
            yield Server(url, admin, token_a, token_b, log)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
