"""An import of a package on NODE_PATH (runtime templates, in-session installs), which Node's own ESM
resolution ignores, resolves as an import (js_esm_hooks.mjs): an ES-module-only package loads, and a
package with both builds loads its `import` build, in a one-shot module and in a context cell alike.
The agent's Node entry points run directly here, with NODE_PATH set as a box's runtime sets it."""

import json
import os
import subprocess

import pytest

from .conftest import AGENT_DIR, js_context

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("needs_node")]


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
    with js_context(tmp_path / "ws", env=env) as cell:
        reply = cell("import {kind as a} from 'esm-only';\nconst b = (await import('dual')).kind;\n[a, b]")
    assert reply.get("exit_code") == 0, cell.stderr()
    assert json.loads(reply["result"]["json"]) == ["esm-only", "dual-esm"]
