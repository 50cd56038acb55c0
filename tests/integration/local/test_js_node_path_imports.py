"""An import of a package on NODE_PATH (runtime templates, in-session installs), which Node's own ESM
resolution ignores, resolves as an import (js_esm_hooks.mjs): an ES-module-only package loads, and a
package with both builds loads its `import` build, in a one-shot module and in a context cell alike.
The agent's Node entry points run directly here, with NODE_PATH set as a box's runtime sets it."""

import fcntl
import json
import os
import subprocess
from pathlib import Path

import pytest

from execbox.agent import js_contexts

pytestmark = pytest.mark.timeout(60)

AGENT_DIR = Path(js_contexts.__file__).parent


@pytest.fixture(autouse=True)
def _needs_node(node_available):
    if not node_available:
        pytest.skip("node is not installed")


@pytest.fixture
def env(tmp_path):
    modules = tmp_path / "runtime" / "node_modules"
    esm = modules / "esm-only"
    esm.mkdir(parents=True)
    (esm / "package.json").write_text(json.dumps({"name": "esm-only", "type": "module",
                                                  "exports": {"import": "./i.js"}}))
    (esm / "i.js").write_text("export const kind = 'esm-only';\n")
    dual = modules / "dual"
    dual.mkdir()
    (dual / "package.json").write_text(json.dumps({"name": "dual", "exports": {"import": "./i.mjs",
                                                                               "require": "./r.cjs"}}))
    (dual / "i.mjs").write_text("export const kind = 'dual-esm';\n")
    (dual / "r.cjs").write_text("exports.kind = 'dual-cjs';\n")
    (tmp_path / "ws").mkdir()
    return {"PATH": os.environ["PATH"], "NODE_PATH": str(modules)}


def test_a_one_shot_module_imports_from_node_path(tmp_path, env):
    code = tmp_path / "code.js"
    code.write_text("import {kind as a} from 'esm-only';\nimport {kind as b} from 'dual';\n"
                    "console.log(a, b, require('dual').kind)")
    r = subprocess.run(["node", str(AGENT_DIR / "js_runner.js"), str(code), ""], cwd=tmp_path / "ws", env=env,
                       capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stdout) == (0, "esm-only dual-esm dual-cjs\n"), r.stderr


def test_a_context_cell_imports_from_node_path(tmp_path, env):
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()

    def fds():  # the pipes as fds 3 and 4 (kept open by pass_fds), whichever numbers they had
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (req_r, rep_w)]
        os.dup2(high[0], 3)
        os.dup2(high[1], 4)

    ws = tmp_path / "ws"
    proc = subprocess.Popen(["node", str(AGENT_DIR / "js_context.js")], preexec_fn=fds, pass_fds=(3, 4), cwd=ws,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(req_r)
    os.close(rep_w)
    try:
        code = "import {kind as a} from 'esm-only';\nconst b = (await import('dual')).kind;\n[a, b]"
        os.write(req_w, (json.dumps({"code": code, "cwd": str(ws)}) + "\n").encode())
        reply = json.loads(os.fdopen(rep_r).readline() or "{}")
    finally:
        os.close(req_w)
        proc.wait(10)
    assert reply.get("exit_code") == 0, proc.stderr.read().decode()
    assert json.loads(reply["result"]["json"]) == ["esm-only", "dual-esm"]
