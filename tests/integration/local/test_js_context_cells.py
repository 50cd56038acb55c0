"""A JavaScript context's cell as a notebook user writes it (js_cells.js): top-level `await`,
`import` (static and dynamic, resolved from the cell's working directory), a declaration made again
in a later cell, errors and syntax errors located in the cell, and the fallback to plain scripts
on a Node without the inspector."""

import json

import pytest

from .conftest import AGENT_DIR, js_context

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("needs_node")]



@pytest.fixture(scope="module")
def workspace(sb):
    """The workspace, holding lib.mjs (an ES module) and node_modules/esmonly, a package that
    can only be imported (its exports map has an `import` condition and nothing else)."""
    r = sb.run_code(
        "import os\n"
        "os.makedirs('node_modules/esmonly', exist_ok=True)\n"
        "open('lib.mjs', 'w').write('export const v = 7; export default \"d\";\\n')\n"
        "open('node_modules/esmonly/package.json', 'w').write("
        "'{\"name\": \"esmonly\", \"type\": \"module\", \"exports\": {\"import\": \"./i.js\"}}')\n"
        "open('node_modules/esmonly/i.js', 'w').write('export const hi = \"esm\";\\n')\n"
        "print(os.getcwd())")
    assert r.exit_code == 0, r
    return r.stdout.strip()


def cell(sb, code, context, **kw):
    return sb.run_code(code, "javascript", context_id=context, **kw)


def value(r):
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return r.result


def test_top_level_await_keeps_its_declarations_for_later_cells(sb):
    r = cell(sb, "const r = await Promise.resolve(41);\nr + 1", "tla")
    assert value(r) == 42
    assert value(cell(sb, "r", "tla")) == 41
    r = cell(sb, "await new Promise((ok) => setTimeout(ok, 20)); console.log('waited'); r * 2", "tla")
    assert value(r) == 82 and r.stdout == "waited\n"


def test_a_later_cell_may_declare_a_name_again(sb):
    assert value(cell(sb, "const x = 1; let y = 2; class K {}; x + y", "redeclare")) == 3
    assert value(cell(sb, "const x = 10; let y = 20; class K { static v = 5 }; x + y + K.v", "redeclare")) == 35


def test_static_and_dynamic_imports_resolve_from_the_cells_directory(sb, workspace):
    r = cell(sb, "import fs, {readFileSync as rf} from 'node:fs'\n"
                 "import d, * as ns from './lib.mjs'\n"
                 "import {hi} from 'esmonly';\n"
                 "[typeof rf, typeof fs.readFileSync, d, ns.v, hi]", "imports")
    assert value(r) == ["function", "function", "d", 7, "esm"]
    # what a cell imported stays defined, and import() works as an expression
    assert value(cell(sb, "[hi, (await import('./lib.mjs')).v]", "imports")) == ["esm", 7]
    # import attributes go along: a JSON module
    sb.files.write("data.json", '{"k": [1, 2]}')
    r = cell(sb, "import data from './data.json' with { type: 'json' };\n"
                 "const again = await import('./data.json', {with: {type: 'json'}});\n[data.k, again.default.k[1]]",
             "imports")
    assert value(r) == [[1, 2], 2]
    # from a directory the cell moved to: ./lib.mjs is that directory's, not the workspace's
    sub = cell(sb, "require('fs').mkdirSync('sub', {recursive: true});"
                   "require('fs').writeFileSync('sub/lib.mjs', 'export const v = 8;'); 1", "imports")
    assert sub.exit_code == 0, sub.stderr
    assert value(cell(sb, "process.chdir('sub'); (await import('./lib.mjs')).v", "imports")) == 8


def test_import_written_inside_strings_and_comments_is_left_as_it_is(sb):
    code = ("const s = [\"import x from 'y'\", `a;\nimport y from 'z'`, 'import(\"q\")',"
            " /import (x)/.test('import x')]; // import z from 'w'\n/* import('q') */ s")
    assert value(cell(sb, code, "strings")) == ["import x from 'y'", "a;\nimport y from 'z'", 'import("q")', True]


def test_errors_of_awaiting_and_importing_cells_are_the_users(sb, workspace):
    r = cell(sb, "await 1;\nnull.x", "errors")
    assert r.exit_code == 1
    assert r.stderr.startswith("TypeError: Cannot read properties of null") and "<cell>:2:6" in r.stderr, r.stderr
    r = cell(sb, "import x from 'nope'", "errors")
    assert r.exit_code == 1 and "Cannot find package 'nope'" in r.stderr, r.stderr
    assert "node:internal" not in r.stderr and str(AGENT_DIR) not in r.stderr, r.stderr
    r = cell(sb, "let ok = 1;\nconst = ;", "errors")
    assert r.exit_code == 1
    assert r.stderr.startswith("<cell>:2\nconst = ;\n      ^\n\nSyntaxError: "), r.stderr
    assert str(AGENT_DIR) not in r.stderr and "node:inspector" not in r.stderr, r.stderr
    r = cell(sb, "function f() { throw new Error('boom') }\nf()", "errors")
    assert r.stderr.strip() == "Error: boom\n    at f (<cell>:1:22)\n    at <cell>:2:1", r.stderr
    # the context lives on
    assert value(cell(sb, "'alive'", "errors")) == "alive"


def test_a_syntax_error_in_an_imported_module_is_not_placed_in_the_cell(sb, workspace):
    # Node keeps the module's SyntaxError and throws that same object at every import of it: it
    # was once located at the importing cell's own line, and the next import showed that line
    # again, from another cell (`await import('./bad.mjs')` under `const m = ...`)
    cell(sb, "require('fs').writeFileSync('bad.mjs', 'export const a = 1;\\nlet q = ;\\n')", "badimport")
    for code in ("await import('./bad.mjs')", "const m = await import('./bad.mjs');"):
        r = cell(sb, code, "badimport")
        assert r.exit_code == 1 and r.error["name"] == "SyntaxError", (r.stderr, r.error)
        assert "<cell>" not in r.stderr and "await import" not in r.stderr, r.stderr
    r = cell(sb, "JSON.parse('{')", "badimport")  # thrown by the cell's code: its own frame shows where
    assert r.error["name"] == "SyntaxError" and "<cell>:1" in r.stderr, r.stderr
    assert value(cell(sb, "'alive'", "badimport")) == "alive"


def test_arguments_call_a_main_that_awaited(sb):
    r = cell(sb, "const base = await Promise.resolve(2);\nasync function main(a) { return a.n * base }",
             "args", arguments={"n": 21})
    assert value(r) == 42


def test_a_node_without_the_inspector_runs_cells_as_scripts(tmp_path):
    """The fallback: cells still run, as plain scripts (no top-level await)."""
    block = tmp_path / "no_inspector.js"
    block.write_text(
        "const Module = require('module'); const load = Module._load;\n"
        "Module._load = function (request, ...rest) {\n"
        "  if (request === 'inspector' || request === 'node:inspector') throw new Error('no inspector');\n"
        "  return load.call(this, request, ...rest);\n};\n")
    with js_context(tmp_path, node_args=("-r", str(block))) as cell:
        assert json.loads(cell("var n = 6; n * 7")["result"]["json"]) == 42
        assert cell("await 1")["exit_code"] == 1
    assert "await is only valid" in cell.stderr()


def test_the_rewrite_leaves_what_is_not_an_import_and_keeps_positions(sb, workspace):
    # a method named import (a private one too) is defined and called, not rewritten
    assert value(cell(sb, "class A { import(x) { return x * 2 } }\nnew A().import(21)", "rewrite")) == 42
    code = "class C { #import(x) { return x * 2 } run() { return this.#import(21) } }\nnew C().run()"
    assert value(cell(sb, code, "rewrite")) == 42
    # an import() whose next line starts with a block is a call, not a method
    assert value(cell(sb, "const p = await import('node:path')\n{ var sep = p.sep }\nsep", "rewrite")) == "/"
    # a template's ${...} is code (an import() there is one), a nested template's text is not
    code = "const fence = `${'`'.repeat(3)}js`;\n[fence, `a ${`import(\"m\")`} b`, (await import('./lib.mjs')).v]"
    assert value(cell(sb, code, "rewrite")) == ["```js", 'a import("m") b', 7]
    # `i++ / 2` is a division: the import() after it is still found
    assert value(cell(sb, "let i = 1;\ni++ / 2 + (await import('./lib.mjs')).v", "rewrite")) == 7.5
    # a rewritten import() keeps the columns of its line, attributes over lines keep the line numbers
    line = "const v = (await import('./lib.mjs')).v; null.x"
    r = cell(sb, line, "rewrite")
    assert f"<cell>:1:{line.index('.x') + 2}\n" in r.stderr + "\n", r.stderr
    sb.files.write("data.json", '{"k": [1, 2]}')
    r = cell(sb, "import data from './data.json' with {\n  type: 'json'\n};\nnull.x", "rewrite")
    assert "    at <cell>:4:6" in r.stderr, r.stderr


def test_a_name_the_module_does_not_export_is_an_error(sb, workspace):
    r = cell(sb, "import {v, nothere} from './lib.mjs'", "exports")
    assert r.exit_code == 1
    assert "does not provide an export named 'nothere'" in r.stderr, r.stderr


def test_a_cell_that_is_an_object_literal_is_its_value(sb):
    assert value(cell(sb, "{a: 1, b: [2]}", "literal")) == {"a": 1, "b": [2]}
    assert value(cell(sb, "{ var inBlock = 3 }\ninBlock", "literal")) == 3  # a block stays a block
    assert value(cell(sb, "{}\n[1, 2].length", "literal")) == 2  # it does not end with }: not an object
    r = cell(sb, "new Map([[1, 2]])", "literal")
    assert (r.exit_code, r.result) == (0, "Map(1) { 1 => 2 }"), (r.result, r.stderr)


def test_a_cell_shadowing_globals_does_not_break_the_context(sb):
    code = "const JSON = 5; const process = {env: {}}; let Promise = 1; const Map = 0; const globalThis = 3;\nJSON"
    assert value(cell(sb, code, "shadow")) == 5
    r = cell(sb, "await null;\nsetTimeout(() => {}, 0);\nthrow new Error('still reported')", "shadow")
    assert r.exit_code == 1 and r.stderr.startswith("Error: still reported"), r.stderr
    assert value(cell(sb, "[typeof JSON, typeof Promise]", "shadow")) == ["number", "number"]


def test_what_a_cell_logs_is_not_kept_alive(sb):
    """The inspector session would keep every logged value (up to 1000 messages); the console a cell
    gets does not report to it. 40 arrays of 8 MB, each garbage once logged: 320 MB if kept."""
    r = cell(sb, "for (let i = 0; i < 40; i++) console.log(new Array(1e6).fill(i).length);\n"
                 "typeof console.Console", "console")
    assert value(r) == "function"
    r = cell(sb, "for (let i = 0; i < 40; i++) console.log(new Array(1e6).fill(i));\n1", "console")
    assert value(r) == 1 and r.stdout.count("999900 more items") == 40
    assert r.metadata["peak_memory_kb"] < 250 * 1024, r.metadata["peak_memory_kb"]


INTERRUPTED = "Error [ERR_SCRIPT_EXECUTION_INTERRUPTED]: Script execution was interrupted by `SIGINT`\n"


@pytest.mark.parametrize("code, arguments", [
    ("while (true) { n++ }", None),  # running: the inspector's evaluation, under the SIGINT watchdog
    ("n++; await new Promise(() => {})", None),  # awaiting: js_context.js ends the wait
    ("function main(a) { for (;;) { n++ } }", {"x": 1}),  # main(arguments), called after the cell
])
def test_a_cell_past_its_time_is_interrupted_and_the_context_kept(sb, code, arguments):
    """As Node's REPL on Ctrl+C and a Python context's cell: the cell ends with Node's interrupt
    error, its `let` and `var` names stay, and what it did before the interrupt is kept."""
    assert value(cell(sb, "var kept = 'yes'; let n = 0; 1", "stop")) == 1
    r = cell(sb, code, "stop", timeout=1, arguments=arguments)
    assert (r.timed_out, r.exit_code, r.stderr) == (True, 1, INTERRUPTED), (r.metadata, r.stderr)
    assert r.metadata["context_note"] == "context 'stop' was interrupted (timeout); its state is kept"
    r = cell(sb, "[kept, n > 0]", "stop")
    assert value(r) == ["yes", True] and "context_restarted" not in r.metadata, r.metadata


def test_a_cancelled_cell_is_interrupted_and_the_context_kept(sb):
    import threading

    assert value(cell(sb, "var kept = 'yes'; 1", "cancel")) == 1
    timer = threading.Timer(0.5, lambda: sb.provider.cancel(sb.instance_id))
    timer.start()
    r = cell(sb, "while (true) {}", "cancel", timeout=30)
    assert r.metadata.get("cancelled") is True and r.stderr == INTERRUPTED, (r.metadata, r.stderr)
    assert "interrupted (cancelled)" in r.metadata["context_note"]
    assert value(cell(sb, "kept", "cancel")) == "yes"


def test_a_cell_busy_after_its_first_await_is_killed(sb):
    """Past its first `await` a cell runs from Node's microtask queue, where no watchdog is: one
    that does not yield there cannot be interrupted, and the context is killed after the grace."""
    cell(sb, "var kept = 'yes'", "busy")
    r = cell(sb, "await null; for (;;) {}", "busy", timeout=1)
    assert r.timed_out and r.metadata.get("context_reset") is True, r.metadata
    r = cell(sb, "typeof kept", "busy")
    assert value(r) == "undefined" and r.metadata.get("context_restarted") is True
