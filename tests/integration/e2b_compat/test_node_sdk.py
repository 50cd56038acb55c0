"""E2B's JavaScript SDK (npm `e2b`, `@e2b/code-interpreter`) runs its quickstart against execbox."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import require

from .conftest import Server

NPM_PACKAGES = ["e2b@2.51.0", "@e2b/code-interpreter@2.8.0"]  # pinned like the Python SDKs
QUICKSTART = Path(__file__).parent / "node" / "quickstart.mjs"


@pytest.fixture(scope="module")
def node_sdk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    npm, node = shutil.which("npm"), shutil.which("node")
    require(bool(npm and node), "node and npm")
    where = tmp_path_factory.mktemp("e2b-node")
    r = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--silent", *NPM_PACKAGES], cwd=where,
                       capture_output=True, text=True, timeout=300)
    require(r.returncode == 0, f"npm packages {NPM_PACKAGES} (npm install failed: {r.stderr[-300:]})")
    shutil.copy(QUICKSTART, where / QUICKSTART.name)
    return where


def test_js_quickstart(node_sdk: Path, e2b_server: Server) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(E2B_API_URL=e2b_server.url, E2B_SANDBOX_URL=e2b_server.url, E2B_API_KEY=e2b_server.token_a)
    r = subprocess.run(["node", QUICKSTART.name], cwd=node_sdk, env=env, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    names = out.pop("names")
    assert out == {"text": "42", "stdout": ["from python\n"], "jsStdout": ["from node\n"],
                   "cmd": "hello from bash\n", "file": "written by node", "running": True}, out
    assert "node.txt" in names
