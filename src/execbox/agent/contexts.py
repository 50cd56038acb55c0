"""Stateful Python contexts: a long-lived child per ``context_id`` whose globals persist.

For each execution the agent passes fresh stdout/stderr/result pipe ends over a unix socket
(SCM_RIGHTS), then the request as a frame; the context runs it in its globals and answers with
a frame holding the exit code. A cell past its time (or cancelled) is interrupted first: a
KeyboardInterrupt in its code, the globals kept, as a notebook's interrupt. One that does not
end then is killed; the next execution with the same id starts from empty globals and says so.
"""

from __future__ import annotations

import os

from . import protocol, py_cells, runners
from .lean import signal

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only

if TYPE_CHECKING:
    import socket
    from typing import Any

MAX_CONTEXTS = 16


class Context:
    # Plain class (no dataclasses, no socket at import time): the agent's imports are on every
    # box's start-up path, and contexts are only needed by sessions that use them.
    __slots__ = ("context_id", "pid", "sock", "executions")

    def __init__(self, context_id: str, pid: int, sock: socket.socket) -> None:
        self.context_id, self.pid, self.sock = context_id, pid, sock
        self.executions = 0


def context_main(sock: socket.socket, workspace: str, artifacts_dir: str) -> None:
    """Body of a context child: serve executions until the socket closes."""
    import socket  # noqa: PLC0415 - already loaded by the agent that forked this child
    globs: dict[str, Any] = {"__name__": "__main__"}
    py_cells.install()  # how a wrapper's cell (E2B's driver) awaits at top level
    # The agent's interrupt of a cell past its time (children._start_in_context), as a notebook's:
    # during a cell, KeyboardInterrupt in its code (Python's own handler: no frame of ours in the
    # traceback), the context's state kept; between cells nothing (ignored since the fork,
    # children.child_prepare).
    devnull = os.open(os.devnull, os.O_RDWR)
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(sock, 1, 3)
            if len(fds) != 3:
                break
            request = protocol.read_frame(sock.fileno())
        except (EOFError, OSError, ValueError):
            break
        out_w, err_w, res_w = fds
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.close(out_w)
        os.close(err_w)
        runners.setup_stdio(bool(request.get("stream")))
        _reset_hwm()
        try:
            os.chdir(request.get("cwd") or workspace)
        except OSError:
            os.chdir(workspace)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            code = runners.run_python(
                request["code"], request.get("arguments"), globs, res_w, artifacts_dir,
                request.get("figure_prefix", "figure"), cell=request.get("cell", True),
            )
        except KeyboardInterrupt:  # came after the cell's own code had ended
            code = 1
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        runners.flush_stdio()
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(res_w)
        try:
            protocol.write_frame(sock.fileno(), {"exit_code": code, "peak_memory_kb": _hwm_kb()})
        except OSError:
            break
    os._exit(0)


def _reset_hwm() -> None:
    """A cell's peak is its own, not the context's lifetime one (a 300 MB cell's figure was
    repeated by every later cell): "5" to clear_refs resets VmHWM to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not on this kernel: the lifetime peak, as before
        pass


def _hwm_kb() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None
