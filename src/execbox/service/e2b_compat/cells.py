"""Jupyter cell semantics over execbox's run contract, and E2B's error/result shapes.

A code-interpreter cell shows the value of its last expression. execbox's agent returns a value
from ``main()``; so a cell ending in an expression is sent with that expression moved into a
one-use ``main`` that removes itself from the context's globals before returning, which keeps
later cells in the same context unaffected. Everything before it runs as written (same line
numbers in tracebacks).
"""

from __future__ import annotations

import ast
import re
from typing import Any

DISPLAY_KEY = "__e2b_display__"

_MAIN = """
def main():
    global main
    del main
    __e2b_value = ({expr})
    if __e2b_value is None:
        return None
    __e2b_out = {{"text": repr(__e2b_value)}}
    for __e2b_attr, __e2b_key in (("_repr_html_", "html"), ("_repr_markdown_", "markdown"),
                                  ("_repr_json_", "json"), ("_repr_latex_", "latex")):
        __e2b_fn = getattr(__e2b_value, __e2b_attr, None)
        if callable(__e2b_fn):
            try:
                __e2b_r = __e2b_fn()
            except Exception:
                __e2b_r = None
            if __e2b_r is not None:
                __e2b_out[__e2b_key] = __e2b_r
    return {{"{key}": __e2b_out}}
"""


def python_cell(code: str) -> str:
    """The program that runs ``code`` as a cell (unchanged when it does not end in an expression)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code  # the agent reports the syntax error with the user's line numbers
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    if any(isinstance(n, ast.Name) and n.id == "main" for n in ast.walk(tree)):
        return code  # the user's own main() keeps execbox's contract
    last = tree.body[-1]
    expr = ast.get_source_segment(code, last.value)
    if expr is None or last.end_lineno is None:
        return code
    lines = code.splitlines(keepends=True)
    head = "".join(lines[: last.lineno - 1]) + lines[last.lineno - 1][: last.col_offset]
    tail = "".join(lines[last.end_lineno:])
    if tail.strip() or lines[last.lineno - 1][: last.col_offset].strip():
        return code  # `a; b` on one line or trailing text: keep it simple and exact
    return head + _MAIN.format(expr="\n".join(expr.splitlines()), key=DISPLAY_KEY)


_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Iteration)?)(?::\s?(.*))?$")


def error_from_stderr(stderr: str, language: str) -> dict[str, str]:
    """E2B's {name, value, traceback} from a failed run's stderr (Python or Node)."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    name, value = "Error", lines[-1].strip() if lines else "execution failed"
    candidates = lines[::-1] if language == "python" else lines
    for ln in candidates:
        m = _EXC_LINE.match(ln.strip())
        if m and (m.group(2) is not None or ln.strip().endswith(("Error", "Exception", "Interrupt"))):
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
    import json

    text = json.dumps(value) if not isinstance(value, str) else value
    extra = {"json": value} if isinstance(value, (dict, list)) else {}
    return {"type": "result", "is_main_result": True, "text": text, **extra}
