"""What makes a Python context's cell a notebook cell, not a file ``python3`` runs (``runners.run_python``
runs both), as IPython and Jupyter do:

- each cell has a file name of its own (``<cell 3>``, IPython's "Cell In[3]"), so a traceback
  through a function an earlier cell defined shows that cell's lines, not the current one's;
- a cell may ``await`` at top level: it runs on the context's one event loop, which every later
  cell shares (a client one cell made is used by the next);
- a last bare expression is the cell's value (``df.head()``, ``x * 2``), unless a ``;`` ends it;
- a ``main`` that needs arguments is only defined, never called without them;
- a wrapper's cell that catches and prints the user's exception itself still reports it as the
  run's ``error`` (``report``).
"""

from __future__ import annotations

import _ast
import sys

from .lean import dumps

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CO_COROUTINE = 0x0080  # inspect.CO_COROUTINE: code compiled with a top-level await in it
FLAGS = _ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
_loop: Any = None
_count = 0  # this context's cells so far


def next_filename() -> str:
    global _count
    _count += 1
    return f"<cell {_count}>"


OUT = "__execbox_out__"  # where a cell's last expression leaves its value, for a moment


def keep_last(code: str, tree: _ast.Module) -> tuple[_ast.Module, bool]:
    """The cell with its last bare expression assigned to ``OUT`` (one code object still, so a
    cell that awaits runs as one coroutine), and whether there was one to keep: not if a ``;``
    ends it, IPython's way to keep a value from showing."""
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, _ast.Expr) or last.end_lineno is None:
        return tree, False
    line = code.splitlines()[last.end_lineno - 1].encode()  # the offset counts UTF-8 bytes
    rest = line[last.end_col_offset or 0:].decode(errors="replace")
    if rest.lstrip().startswith(";"):
        return tree, False
    target = _ast.Name(id=OUT, ctx=_ast.Store())
    keep = _ast.Assign(targets=[target], value=last.value)
    for node in (target, keep):
        node.lineno, node.col_offset = last.lineno, last.col_offset
        node.end_lineno, node.end_col_offset = last.end_lineno, last.end_col_offset
    return _ast.Module(body=[*tree.body[:-1], keep], type_ignores=[]), True


def exec_cell(compiled: Any, globs: dict[str, Any]) -> Any:
    """Run a cell's code object (compiled with ``FLAGS``); what ``eval`` gives. Code that awaits at
    top level is a coroutine, run to its end on the context's loop. E2B's cell driver
    (service/e2b_compat/cells.py) runs its cells through this too."""
    value = eval(compiled, globs)  # noqa: S307 - running the user's program is the point
    if compiled.co_flags & CO_COROUTINE:
        value = run_coroutine(value)
    return value


def run_coroutine(coro: Any) -> Any:
    """``coro`` run to its end on the context's one event loop, the current loop again (an
    ``asyncio.run()`` in an earlier cell unset it) for the cell's synchronous code."""
    import asyncio

    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    asyncio.set_event_loop(_loop)
    task = _loop.create_task(coro)
    try:
        return _loop.run_until_complete(task)
    except BaseException:
        # interrupted (its timeout, a cancel) in the loop, not in the cell's code: the cell's task
        # is cancelled and unwound now, as asyncio.Runner does, or it would go on in later cells
        if not task.done():
            task.cancel()
            try:
                _loop.run_until_complete(task)
            except BaseException:  # noqa: BLE001 - the cell's own end; the interrupt is what is reported
                pass
        raise


def needs_arguments(main: Any) -> bool:
    """Whether ``main`` has a parameter without a default (then a cell only defines it)."""
    code = getattr(main, "__code__", None)
    if code is None:
        return False
    required = code.co_argcount - len(getattr(main, "__defaults__", None) or ())
    kwonly = code.co_kwonlyargcount - len(getattr(main, "__kwdefaults__", None) or {})
    return required > 0 or kwonly > 0


def shown(value: Any, encoded: dict[str, Any]) -> dict[str, Any]:
    """A last expression's value as a result: ``encoded`` (its JSON, runners.encode_value) when it
    fits, else its ``repr``, as IPython shows it."""
    if "error" in encoded:
        return {"present": True, "json": dumps(repr(value)), "type": "repr"}
    return encoded


_reported: tuple[BaseException, str] | None = None


def report(e: BaseException, traceback: str) -> None:
    """A wrapper's cell (E2B's driver) that catches the user's exception, prints its own form of
    the traceback and ends the cell itself (``SystemExit(1)``, which is no error of its own) gives
    the exception and that text here: the run's ``error`` is then built from them, as for an
    exception the runner caught (runners.error_of)."""
    global _reported
    _reported = (e, traceback)


def reported(e: BaseException) -> bool:
    """Whether ``e`` is the exception the cell's wrapper reported: E2B's driver reports a
    ``MemoryError`` and raises it on (so the run says the allocation failed); it is the run's
    error as reported, with the cell's frames only, and not printed on stderr."""
    return _reported is not None and _reported[0] is e


def take_reported() -> tuple[BaseException, str] | None:
    """What ``report`` was given during the cell that just ran (None if nothing), once."""
    global _reported
    got, _reported = _reported, None
    return got


def install() -> None:
    """Where E2B's cell driver finds ``exec_cell`` (it is sent as code, and imports nothing)."""
    sys.modules["_execbox_cell"] = sys.modules[__name__]
