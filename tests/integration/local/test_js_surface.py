"""What JavaScript user code sees of the agent that runs it (js_runner.js, js_context.js): its own
argv, require and module (the workspace's node_modules found, no agent path), errors as the
user's (no runner frames, Node's loader header or version line), arguments in a context, a
context's real exit status and each cell's own peak memory."""

import json
import time

import pytest

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("needs_node")]

AGENT_FILES = ("js_runner", "js_context", "js_common", "execbox/agent")


@pytest.fixture(scope="module")
def workspace(sb):
    """The workspace, holding node_modules/foo and lib/bar (a NODE_PATH entry)."""
    r = sb.run_code(
        "import os\n"
        "for d, text in (('node_modules/foo', 'foo!'), ('lib/bar', 'bar!')):\n"
        "    os.makedirs(d, exist_ok=True)\n"
        "    open(f'{d}/index.js', 'w').write(f'module.exports = {text!r};')\n"
        "print(os.getcwd())")
    assert r.exit_code == 0, r
    return r.stdout.strip()


def no_agent_path(text):
    return not any(name in text for name in AGENT_FILES)


PROBE = ("JSON.stringify({foo: require('foo'), argv: process.argv.slice(1), main: require.main === module,"
         " filename: require.main.filename, paths: module.paths, resolve: require.resolve.paths('x')})")


# -- 1. argv, require and module ------------------------------------------------------------------

def test_one_shot_sees_its_own_argv_require_and_module(sb, workspace):
    r = sb.run_code(f"function main() {{ return {PROBE}; }}", "javascript")
    assert r.exit_code == 0, r.stderr
    assert no_agent_path(r.result), r.result
    seen = json.loads(r.result)
    assert seen["foo"] == "foo!" and seen["argv"] == ["<code>"] and seen["main"] is True
    assert seen["filename"] == f"{workspace}/<code>" and seen["paths"][0] == f"{workspace}/node_modules"


def test_context_cell_sees_its_own_require_and_module(sb, workspace):
    r = sb.run_code(PROBE, "javascript", context_id="js-require")
    assert r.exit_code == 0, r.stderr
    seen = json.loads(r.result)
    assert no_agent_path(r.result), r.result
    assert seen["foo"] == "foo!" and seen["argv"] == [] and seen["main"] is True
    assert seen["paths"][0] == f"{workspace}/node_modules"
    # a cell that moved elsewhere requires from there (relative paths and node_modules alike)
    r = sb.run_code("process.chdir('lib'); require('./bar')", "javascript", context_id="js-require")
    assert (r.exit_code, r.result) == (0, "bar!"), r.stderr


def test_node_path_lookups_still_work(sb, workspace):
    # runtime templates and in-session installs put their node_modules on NODE_PATH
    request = {"language": "javascript", "code": "function main() { return require('bar') }",
               "env": {"NODE_PATH": f"{workspace}/lib"}}
    r = sb.provider._exec(sb.instance_id, request, 30, None, False)
    assert (r.exit_code, r.result) == (0, "bar!"), r.stderr


def test_a_missing_module_names_no_agent_file(sb, workspace):
    for r in (sb.run_code("require('nope')", "javascript"),
              sb.run_code("require('nope')", "javascript", context_id="js-errors")):
        assert r.exit_code == 1
        assert r.stderr.startswith("Error: Cannot find module 'nope'\nRequire stack:\n"), r.stderr
        assert "throw err" not in r.stderr and "node:internal/modules/cjs/loader:" not in r.stderr.split("\n")[0]
        assert no_agent_path(r.stderr), r.stderr


# -- 2. errors ------------------------------------------------------------------------------------

def test_an_unhandled_rejection_in_a_one_shot_is_the_users_error(sb):
    r = sb.run_code("console.log('before')\nasync function run(){ await Promise.reject(new Error('x')) }\nrun();",
                    "javascript")
    assert (r.stdout, r.exit_code) == ("before\n", 1)
    assert r.stderr == "Error: x\n    at run (<code>:2:44)\n    at <code>:3:1\n", r.stderr
    r = sb.run_code("Promise.reject(42)", "javascript")  # Node's own words here are a stack of its frames
    assert (r.exit_code, r.stderr) == (1, "execbox: a promise was rejected and nothing handled it: 42\n")


def test_an_error_thrown_by_a_timer_in_a_one_shot_ends_the_run(sb):
    r = sb.run_code("setTimeout(() => { null.x }, 1);\nsetTimeout(() => console.log('later'), 300);\n"
                    "console.log('hi')", "javascript")
    assert (r.stdout, r.exit_code) == ("hi\n", 1)  # as Node's default: the later timer never runs
    assert r.stderr == ("TypeError: Cannot read properties of null (reading 'x')\n"
                        "    at Timeout._onTimeout (<code>:1:25)\n"), r.stderr


def test_a_thrown_non_error_is_shown_as_node_shows_it(sb):
    for r in (sb.run_code("throw {code: 42}", "javascript"),
              sb.run_code("throw {code: 42}", "javascript", context_id="js-errors")):
        assert (r.exit_code, r.stderr) == (1, "{ code: 42 }\n")
    assert sb.run_code("throw 'boom'", "javascript").stderr == "boom\n"


def test_a_context_late_error_is_shown_as_the_users(sb):
    r = sb.run_code("Promise.reject(new Error('late')); setTimeout(() => { null.y }, 10); 1",
                    "javascript", context_id="js-late")
    # the rejection it left floating is its own error (a cell lets the event loop turn once)
    assert (r.exit_code, r.error["name"], r.error["value"]) == (1, "Error", "late"), r
    assert r.stderr == "Error: late\n    at <cell>:1:16\n", r.stderr
    time.sleep(0.3)
    r = sb.run_code("2", "javascript", context_id="js-late")
    # the timer fired after the cell answered: shown with the next run, said to be no error of it
    assert (r.exit_code, r.error, r.result) == (0, None, 2), r
    assert r.stderr.startswith("execbox: an error after its cell had answered (not this cell's): "
                               "TypeError: Cannot read properties of null (reading 'y')\n"
                               "    at Timeout._onTimeout (<cell>:1:"), r.stderr
    assert no_agent_path(r.stderr) and "node:" not in r.stderr, r.stderr


# -- 3. arguments in a context ----------------------------------------------------------------------

def test_context_arguments_call_main_as_a_one_shot_does(sb):
    code = "function main(a) { return a.n * 2 }"
    assert sb.run_code(code, "javascript", arguments={"n": 21}).result == 42
    r = sb.run_code(code, "javascript", context_id="js-args", arguments={"n": 21})
    assert (r.result, r.exit_code) == (42, 0), r
    # a main() an earlier cell defined, async, as in Python contexts
    sb.run_code("var total = 1; async function main(a) { return a.k + total }", "javascript", context_id="js-args2")
    r = sb.run_code("total = 10", "javascript", context_id="js-args2", arguments={"k": 5})
    assert (r.result, r.exit_code) == (15, 0), r
    r = sb.run_code("1", "javascript", context_id="js-noargs-main", arguments={"k": 5})
    assert r.exit_code == 1 and "no main() function" in r.stderr and r.result is None
    r = sb.run_code("function main() { return 10n }", "javascript", context_id="js-args3", arguments={})
    assert r.exit_code == 1 and "not JSON-serializable" in r.stderr and r.result is None
    # without arguments a cell's value stays the result, main() is not called
    r = sb.run_code("function main() { throw new Error('called') }\n'value'", "javascript", context_id="js-args4")
    assert (r.result, r.exit_code) == ("value", 0), r


# -- 4. a context that exits -------------------------------------------------------------------------

def test_a_context_that_exits_reports_its_exit_code(sb):
    r = sb.run_code("console.log('a'); process.exit(3)", "javascript", context_id="js-exit")
    assert (r.stdout, r.exit_code, r.metadata.get("context_reset")) == ("a\n", 3, True), r
    r = sb.run_code("console.log('again')", "javascript", context_id="js-exit")
    assert (r.stdout, r.exit_code, r.metadata.get("context_restarted")) == ("again\n", 0, True), r


# -- 5. each cell's own peak memory ------------------------------------------------------------------

def test_a_context_cell_reports_its_own_peak_memory(sb):
    big = sb.run_code(
        "(() => { const b = Buffer.alloc(200 * 1024 * 1024, 1); return b[b.length - 1]; })()", "javascript",
        context_id="js-peak")
    assert big.exit_code == 0, big.stderr
    # let the buffer go now (gc is not exposed to cells otherwise), so the next cell starts small
    sb.run_code("require('v8').setFlagsFromString('--expose-gc'); require('vm').runInNewContext('gc')(); 0",
                "javascript", context_id="js-peak")
    small = sb.run_code("1 + 1", "javascript", context_id="js-peak")
    assert small.exit_code == 0 and small.result == 2
    big_kb, small_kb = big.metadata["peak_memory_kb"], small.metadata["peak_memory_kb"]
    assert big_kb > 200 * 1024, big_kb
    assert small_kb < big_kb - 150 * 1024, (big_kb, small_kb)


def test_a_require_stack_of_only_agent_files_is_dropped():
    """js_common.userStack on its own: a `Require stack:` naming only execbox's files goes (one
    naming the user's files stays), as does the loader's source line above the message."""
    import os
    import subprocess

    from execbox.agent import runners

    common = os.path.join(os.path.dirname(runners.JS_RUNNER), "js_common.js")
    script = """
const { userStack } = require(process.argv[1]);
const agent = require("path").dirname(process.argv[1]);
function shown(list) {
  const e = new Error("Cannot find module 'nope'\\nRequire stack:\\n" + list.map((p) => "- " + p).join("\\n"));
  e.stack = "node:internal/modules/cjs/loader:1210\\n  throw err;\\n  ^\\n\\n" + e.stack.split("\\n    at ")[0] +
    "\\n    at require (node:internal/modules/helpers:182:18)\\n    at <code>:1:1";
  return userStack(e, "/nowhere");
}
console.log(JSON.stringify([shown([agent + "/js_runner.js"]), shown(["/ws/node_modules/a/index.js", "/ws/<code>"])]));
"""
    out = subprocess.run(["node", "-e", script, common], capture_output=True, text=True, timeout=30, check=True)
    only_agent, users = json.loads(out.stdout)
    assert only_agent == ("Error: Cannot find module 'nope'\n    at require (node:internal/modules/helpers:182:18)\n"
                          "    at <code>:1:1")
    assert users.startswith("Error: Cannot find module 'nope'\nRequire stack:\n- /ws/node_modules/a/index.js\n")


@pytest.mark.parametrize("code", [
    "function main() { console.log('in main'); }\nmain();",
    "async function main() { console.log('in main'); }\nmain().catch((e) => console.error(e));",
    "const main = () => console.log('in main');\nsetTimeout(main, 1);",
    "async function main() { console.log('in main'); }\n(async () => { await main(); })();",
])
def test_a_program_that_calls_main_itself_runs_it_once(sb, node_available, code):
    """review 24: `main();` at the end of a script (the commonest Node shape) ran main twice."""
    if not node_available:
        pytest.skip("node is not installed")
    r = sb.run_code(code, "javascript")
    assert (r.stdout, r.stderr, r.exit_code) == ("in main\n", "", 0), r


def test_main_the_program_only_defines_is_called_whatever_its_strings_say(sb, node_available):
    if not node_available:
        pytest.skip("node is not installed")
    r = sb.run_code("// main() is called for us\nfunction main() { console.log('in main()'); return {main: 1}; }",
                    "javascript")
    assert (r.stdout, r.result) == ("in main()\n", {"main": 1}), r


def test_an_es_module_imports_from_its_directory_the_workspace_packages_and_node_path(sb, workspace):
    """`import` and top-level await were SyntaxErrors (Node runs such a file as an ES module)."""
    sb.run_code("open('helper.mjs', 'w').write('export const z = 3;')")
    code = ("import fs from 'node:fs';\nimport foo from 'foo';\nimport bar from 'bar';\n"
            "import { z } from './helper.mjs';\n"
            "const x = await Promise.resolve(5);\n"
            "console.log(typeof fs.readFileSync, foo, bar, z, x, import.meta.url, process.argv.length);")
    request = {"language": "javascript", "code": code, "env": {"NODE_PATH": f"{workspace}/lib"}}
    r = sb.provider._exec(sb.instance_id, request, 30, None, False)
    assert (r.stdout, r.stderr, r.exit_code) == ("function foo! bar! 3 5 execbox:code 2\n", "", 0), r
    r = sb.run_code("console.log(await Promise.resolve('tla'))", "javascript")
    assert (r.stdout, r.exit_code) == ("tla\n", 0), r.stderr


def test_an_es_modules_errors_read_as_the_users(sb, workspace):
    r = sb.run_code("import fs from 'fs';\nconst a = 1;\nnull.y;", "javascript")
    assert r.stderr == "TypeError: Cannot read properties of null (reading 'y')\n    at <code>:3:6\n", r.stderr
    r = sb.run_code("import fs from 'fs';\nlet = ;", "javascript")
    assert r.stderr.startswith("<code>:2\nlet = ;\n"), r.stderr
    assert "SyntaxError: Unexpected strict mode reserved word" in r.stderr
    r = sb.run_code("import x from 'nope_pkg';", "javascript")
    assert "Cannot find package 'nope_pkg'" in r.stderr and not any(a in r.stderr for a in AGENT_FILES), r.stderr
    r = sb.run_code("const x = await 1;\nfunction main(a) { return a; }", "javascript", arguments={"n": 1})
    assert r.exit_code == 1 and "module exports no main() function" in r.stderr


@pytest.mark.parametrize("context", [None, "args"])
def test_arguments_name_main_and_an_empty_object_names_nothing(sb, context):
    """As in Python: arguments with something in them need a main(); `{}` (what RAGFlow's /run
    always sends) does not, and a main() there is still called."""
    missing = "execbox: arguments were given but the code defines no main() function\n"
    r = sb.run_code("console.log('plain')", "javascript", arguments={"x": 1}, context_id=context)
    assert (r.exit_code, r.stderr) == (1, missing), r.stderr
    r = sb.run_code("console.log('plain')", "javascript", arguments={}, context_id=context)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "plain\n", ""), r.stderr
    r = sb.run_code("function main(a) { return Object.keys(a).length }", "javascript", arguments={},
                    context_id=context)
    assert (r.exit_code, r.result) == (0, 0), r.stderr
