"""Jupyter cell semantics over execbox's run contract, and E2B's error/result shapes.

A code-interpreter cell shows the value of its last expression and never calls ``main()`` by
itself; execbox's agent returns a value from ``main()`` and calls a defined ``main`` (its run
contract). So a cell ending in an expression is sent with that expression moved into a one-use
``main`` that first puts back whatever ``main`` the context had (the user's own function is
kept, and called only if the expression calls it), and any other cell gets an empty
``if __name__ == "__main__"`` guard appended, which tells the agent the program runs as a script
(no implicit ``main()`` call). Everything the user wrote runs as written (same line numbers in
tracebacks).
"""

from __future__ import annotations

import ast
import re
from typing import Any

DISPLAY_KEY = "__e2b_display__"

_MAIN = """
__e2b_saved_main = globals().get("main")
def main():
    global main, __e2b_saved_main
    if __e2b_saved_main is None:
        del main
    else:
        main = __e2b_saved_main
    del __e2b_saved_main
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


_GUARD = "\n\nif __name__ == \"__main__\":\n    pass\n"


def python_cell(code: str) -> str:
    """The program that runs ``code`` as a cell (see the module docstring)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code  # the agent reports the syntax error with the user's line numbers
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code + _GUARD
    last = tree.body[-1]
    expr = ast.get_source_segment(code, last.value)
    lines = code.splitlines(keepends=True)
    if expr is None or last.end_lineno is None or "".join(lines[last.end_lineno:]).strip() \
            or lines[last.lineno - 1][: last.col_offset].strip():
        return code + _GUARD  # `a; b` on one line or trailing text: no displayed value
    head = "".join(lines[: last.lineno - 1])
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
