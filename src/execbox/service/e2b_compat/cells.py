"""Jupyter cell semantics over execbox's run contract, and E2B's error/result shapes.

A Python cell is sent as a small launcher program: it hands the cell's source (a string
literal) to a driver (``_DRIVER``, run in a namespace of its own) that behaves as IPython does:

- it compiles the source itself as ``Cell In[N]`` (and seeds linecache with it), so tracebacks show
  the user's own lines and line numbers, never the driver's; frames before the cell's are cut;
- when the last statement (by the ast) is an expression, its value is the cell's result
  (``x += 1; x`` shows ``x``), unless a ``;`` ends the cell (IPython's rule: ``x;`` shows
  nothing); the agent's ``py_cells.keep_last`` keeps it, so a cell that awaits still runs as one
  coroutine;
- ``SystemExit`` (``sys.exit(3)``) is an error named ``SystemExit`` whose value is the exit code,
  with IPython's short notice as the traceback, and the context lives on;
- the sandbox's envs (``Sandbox.create(envs=...)``) are set in ``os.environ`` by a context's first
  cell, for good (E2B starts its kernels with them); the run's ``env`` is set for the cell's
  duration and put back afterwards (what the cell set itself is left alone);
- a context's ``cwd`` (relative to the workspace) is the cell's directory.

execbox's agent returns a value from ``main()`` and calls a defined ``main`` (its run contract),
so a cell with a value installs a one-use ``main`` that first puts back whatever ``main`` the
context had (the user's own function is kept), and returns the value's representations; any
other cell gets an empty ``if __name__ == "__main__"`` guard appended, which tells the agent the
program runs as a script (no implicit ``main()`` call). A failed cell hands the exception and its
traceback text to the agent's ``py_cells.report`` (the run's ``error``: name, value, traceback,
as for any cell) without printing it on stderr (a Jupyter kernel sends a traceback as the error
message only, so E2B's ``logs.stderr`` holds what the cell printed itself), and ends the run with
exit code 1. A ``MemoryError`` is reported the same way, then raised on, so the agent can say the
run's allocation failed (its ``oom``); the agent does not print a reported error again.

The driver is compiled once per context process (kept in ``sys.modules`` under a name that
carries its hash). The launcher imports nothing and calls no builtin function by name, so a
provider's AST policy (``enable_ast_analysis``) has nothing to object to in it; the interpreter
checks the user's own code against that policy instead (interpreter.py), as the provider would.

A JavaScript cell is wrapped likewise (``js_cell``): the wrapper first asks the agent
(js_context.js's ``execbox.cell.quiet``) to report the cell's error (thrown, rejected, or a
callback's or unhandled rejection's before the cell answers) as the run's ``error`` only, not on
stderr too, as the Python driver does; it sets the envs and ``cwd``, runs the source as a cell
of its own (``<cell>``, the user's line numbers, top-level ``await`` and ``import``, through the
agent's cell runner) in the context's global scope, and puts the run's envs back once the value
(awaited if a Promise) is settled.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import re
import tokenize
from typing import Any

DISPLAY_KEY = "__e2b_display__"

_DRIVER = r'''
import sys, os, _ast

_MISSING = object()
_PREFIX = "Cell In["  # a cell's file name, IPython's: "Cell In[3]" (each its own: an earlier
_cells = 0           # cell's function shows its own lines in a later cell's traceback)
_LAUNCHER_NAMES = ("__e2b_b", "__e2b_sys", "__e2b_m")
_started = False


def _display(value):
    import json
    out = {"text": repr(value)}
    for attr, key in (("_repr_html_", "html"), ("_repr_markdown_", "markdown"),
                      ("_repr_json_", "json"), ("_repr_latex_", "latex")):
        fn = getattr(value, attr, None)
        if callable(fn):
            try:
                r = fn()
                json.dumps(r)  # what cannot travel is left out, as IPython leaves out a failing repr
            except Exception:
                r = None
            if r is not None:
                out[key] = r
    return out


def _report(e, text):
    # the run's error: this exception, this text (agent/py_cells.py); not on stderr too, as a
    # kernel sends a traceback as its error message only (an agent without report: on stderr)
    report = getattr(sys.modules["_execbox_cell"], "report", None)
    if report is None:
        sys.stderr.write(text)
    else:
        report(e, text)


def _traceback(e):
    import traceback
    tb = e.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith(_PREFIX):
        tb = tb.tb_next  # the driver's own frames: the cell's come first, as in IPython
    return "".join(traceback.format_exception(type(e), e, tb))


def _run(src, start_env, env, cwd, show, key, g):
    global _started, _cells
    import linecache
    _cells += 1
    name = _PREFIX + str(_cells) + "]"
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    if not _started:  # this context's first cell: the sandbox's envs, as a kernel starts with them
        _started = True
        os.environ.update(start_env)
    before = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        os.environ[k] = v
    try:
        try:
            if cwd:
                os.chdir(cwd)
            tree = compile(src, name, "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
            # the agent's cell runner (agent/py_cells.py, in every context): top-level await on
            # the context's event loop, the last expression kept within the one code object
            cell = sys.modules["_execbox_cell"]
            body, kept = cell.keep_last(src, tree) if show else (tree, False)
            cell.exec_cell(compile(body, name, "exec", cell.FLAGS, dont_inherit=True), g)
            value = g.pop(cell.OUT, None) if kept else None
            out = None if value is None else _display(value)
        except MemoryError as e:
            # the cell's error, as any other (its frames only, not on stderr); raised on, so the
            # agent can tell an allocation failed (its ``oom``). No memory left to format it: the
            # agent reports it instead (its short form)
            try:
                _report(e, _traceback(e))
            except MemoryError:
                pass
            raise
        except SystemExit as e:
            import traceback
            _report(e, "An exception has occurred, use %tb to see the full traceback.\n\n"
                    + "".join(traceback.format_exception_only(type(e), e)))
            raise SystemExit(1) from None
        except BaseException as e:
            _report(e, _traceback(e))
            raise SystemExit(1) from None
    finally:
        for k, v in env.items():
            if os.environ.get(k) == v:  # unless the cell changed it itself
                if before[k] is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = before[k]
    if show:
        saved = g.get("main", _MISSING)

        def main():
            if saved is _MISSING:
                g.pop("main", None)
            else:
                g["main"] = saved
            return None if out is None else {key: out}

        g["main"] = main


def run(*args):
    g = sys._getframe(1).f_globals  # the launcher's: the context's globals
    for name in _LAUNCHER_NAMES:
        g.pop(name, None)
    _run(*args, g)
'''

_DRIVER_MODULE = "_execbox_e2b_cell_" + hashlib.sha256(_DRIVER.encode()).hexdigest()[:12]

_LAUNCHER = """try:
    __e2b_b = __builtins__.__dict__
except AttributeError:
    __e2b_b = __builtins__
__e2b_sys = __e2b_b["__import__"]("sys")
__e2b_m = __e2b_sys.modules.get({module!r})
if __e2b_m is None:
    __e2b_m = __e2b_b["type"](__e2b_sys)({module!r})
    __e2b_b["exec"]({driver!r}, __e2b_m.__dict__)
    __e2b_sys.modules[{module!r}] = __e2b_m
__e2b_m.run({args})
"""

_GUARD = "\n\nif __name__ == \"__main__\":\n    pass\n"


def shows_value(code: str, tree: ast.Module) -> bool:
    """IPython's rule: the last statement is an expression and no ``;`` ends the cell."""
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return False
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return True
    skip = (tokenize.ENDMARKER, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)
    for tok in reversed(tokens):
        if tok.type in skip:
            continue
        return not (tok.type == tokenize.OP and tok.string == ";")
    return True


def python_cell(code: str, env: dict[str, str] | None = None, cwd: str | None = None,
                start_env: dict[str, str] | None = None) -> str:
    """The program that runs ``code`` as a cell (see the module docstring).

    ``start_env`` is set in the context's first cell and stays (the sandbox's envs: E2B starts
    the kernel with them); ``env`` is set for this cell's duration only; ``cwd`` is the cell's
    directory, relative to the run's (the workspace). Code that does not parse goes the same
    way: the driver's compile reports the syntax error in ``Cell In[N]``, as a runtime error is."""
    try:
        show = shows_value(code, ast.parse(code))
    except (SyntaxError, ValueError):
        show = False
    args = ", ".join(repr(a) for a in (code, dict(start_env or {}), dict(env or {}), cwd or None, show, DISPLAY_KEY))
    program = _LAUNCHER.format(module=_DRIVER_MODULE, driver=_DRIVER, args=args)
    return program if show else program + _GUARD


# Sent with every JavaScript cell, so without comments (a cell's source is parsed each time):
# - `quiet` (the agent's, js_context.js): the cell's error is the run's error only, not on stderr
#   too (an older agent has none: it is printed as before);
# - the context's first cell sets the sandbox's envs for good; the run's envs hold until the
#   cell's value is settled, then are put back unless the cell changed them itself;
# - `execbox.cell.run` (the agent's, js_cells.js) runs the source as a cell of its own: top-level
#   await, imports, the user's line numbers.
_JS_WRAPPER = """(function (src, startEnv, env, cwd) {
  const quiet = globalThis[Symbol.for("execbox.cell.quiet")];
  if (typeof quiet === "function") quiet();
  const started = Symbol.for("execbox.e2b.started");
  if (!globalThis[started]) {
    globalThis[started] = true;
    Object.assign(process.env, startEnv);
  }
  const before = {};
  for (const k of Object.keys(env)) { before[k] = process.env[k]; process.env[k] = env[k]; }
  const restore = () => {
    for (const k of Object.keys(env)) {
      if (process.env[k] !== env[k]) continue;
      if (before[k] === undefined) delete process.env[k]; else process.env[k] = before[k];
    }
  };
  let value;
  try {
    if (cwd) { process.chdir(cwd); globalThis.__dirname = process.cwd(); }
    value = globalThis[Symbol.for("execbox.cell.run")](src);
  } catch (e) { restore(); throw e; }
  if (value && typeof value.then === "function") return Promise.resolve(value).finally(restore);
  restore();
  return value;
})(%s, %s, %s, %s)"""


def js_cell(code: str, env: dict[str, str] | None = None, cwd: str | None = None,
            start_env: dict[str, str] | None = None) -> str:
    """``code`` for a JavaScript context, wrapped (as ``python_cell``, always: its error must not
    be printed on stderr, see the module docstring) to apply the envs and ``cwd``."""
    return _JS_WRAPPER % (json.dumps(code), json.dumps(dict(start_env or {})), json.dumps(dict(env or {})),
                          json.dumps(cwd or None))


# `ValueError: msg`, and Node's `TypeError [ERR_INVALID_ARG_TYPE]: msg` (the code is not the name)
_EXC_LINE = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Iteration)?)(?: \[[A-Z0-9_]+\])?(?::\s?(.*))?$")


def error_from_stderr(stderr: str, language: str) -> dict[str, str]:
    """E2B's {name, value, traceback} from a failed run's stderr (Python or Node), where the run
    reports no ``error`` of its own (interpreter.py): a bash cell, a Python or JavaScript run that
    failed without an exception (``os._exit(3)``, a killed context, a value ``main()`` returned
    that is not JSON), or a provider whose results do not carry it (RAGFlow's ``/run``)."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    name, value = "Error", lines[-1].strip() if lines else "execution failed"
    candidates = lines[::-1] if language == "python" else lines
    for ln in candidates:
        m = _EXC_LINE.match(ln.strip())
        if m and (m.group(2) is not None or ln.strip().endswith(("Error", "Exception", "Interrupt", "SystemExit"))):
            name, value = m.group(1).rsplit(".", 1)[-1], (m.group(2) or "").strip()
            break
    return {"name": name, "value": value, "traceback": stderr}


def display_result(value: Any) -> dict[str, Any] | None:
    """An E2B main result from the value our cell's main() returned, or a plain main() value."""
    if isinstance(value, dict) and DISPLAY_KEY in value and isinstance(value[DISPLAY_KEY], dict):
        out = {k: v for k, v in value[DISPLAY_KEY].items() if k in ("text", "html", "markdown", "json", "latex")}
        return {"type": "result", "is_main_result": True, **out}
    if value is None:
        return None
    text = json.dumps(value) if not isinstance(value, str) else value
    extra = {"json": value} if isinstance(value, (dict, list)) else {}
    return {"type": "result", "is_main_result": True, "text": text, **extra}
