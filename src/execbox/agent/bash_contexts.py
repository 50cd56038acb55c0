"""Stateful bash contexts: a long-lived shell per ``context_id`` whose variables, functions,
aliases, options and working directory persist between cells, as in a Jupyter bash kernel.

The shell is interactive (``-i``, no line editing, no job control, no history), like the one a
bash kernel drives: an error inside a cell (``${x:?}``, an unset variable under ``set -u``, a
syntax error) ends that cell, not the shell. ``exit`` ends the shell, and ``set -e`` with a
failing command does too; the context is then dropped like a timed-out one.

Its pipes (js_contexts.JsContext, plus one): fd 0 takes two fixed command lines per cell,
fd 3 that cell's data (the file holding its code, then its ``env`` as name/value pairs, all
NUL-terminated: nothing the caller sends is ever parsed as shell syntax), fd 4 the reply line
``{"exit_code":N}``, stdout and stderr its own for life. A cell's code is sourced from a file
with fds 3 and 4 closed and stdin on /dev/null, so what it runs sees neither. ``env`` is set
for the cell and put back after it unless the cell changed it (E2B's ``run_code(envs=...)``).
The request's ``cwd`` and ``start_env`` are where and with what environment a new context
starts (E2B's sandbox ``envs``); after that, ``cd`` and ``export`` in a cell carry over.
"""

from __future__ import annotations

import os
import time

from . import js_contexts, procs

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any

# Sent once to the shell's stdin. The helpers' names start with __execbox_; a cell that
# redefines them, or the builtins they call, breaks only its own context.
SETUP = rb"""unset HISTFILE MAILCHECK MAILPATH MAIL PROMPT_COMMAND
set +o history +m +H
__execbox_pre() {
  IFS= builtin read -r -d '' __execbox_file <&3 || builtin exit 0
  IFS= builtin read -r -d '' __execbox_n <&3 || builtin exit 0
  __execbox_names=() __execbox_new=() __execbox_old=() __execbox_had=()
  local __execbox_k __execbox_v
  while (( __execbox_n > 0 )); do
    IFS= builtin read -r -d '' __execbox_k <&3 || builtin exit 0
    IFS= builtin read -r -d '' __execbox_v <&3 || builtin exit 0
    __execbox_names+=("$__execbox_k") __execbox_new+=("$__execbox_v")
    if [[ -n ${!__execbox_k+x} ]]; then
      __execbox_had+=(1) __execbox_old+=("${!__execbox_k}")
    else
      __execbox_had+=(0) __execbox_old+=("")
    fi
    builtin export "$__execbox_k=$__execbox_v"
    __execbox_n=$((__execbox_n - 1))
  done
}
__execbox_answer() {
  local __execbox_rc=$1 __execbox_i=0 __execbox_k
  for __execbox_k in "${__execbox_names[@]}"; do
    if [[ -n ${!__execbox_k+x} && ${!__execbox_k} == "${__execbox_new[__execbox_i]}" ]]; then
      if [[ ${__execbox_had[__execbox_i]} == 1 ]]; then
        builtin export "$__execbox_k=${__execbox_old[__execbox_i]}"
      else
        builtin unset "$__execbox_k"
      fi
    fi
    __execbox_i=$((__execbox_i + 1))
  done
  builtin printf '{"exit_code":%d}\n' "$__execbox_rc" >&4
}
exec 2>&5 5>&-
"""
# One cell: the first line reads the cell's data and sources its file; if an error ends that
# line early, the second still answers (with the status the error left).
CELL = b'__execbox_pre; builtin source "$__execbox_file" </dev/null 3<&- 4>&-\n__execbox_answer "$?"\n'
EXIT_WAIT = 1.0  # seconds to wait for a shell whose reply pipe closed to be reapable


class BashContext(js_contexts.JsContext):
    __slots__ = ("cmd_w",)

    def __init__(self, context_id: str, pid: int, out_r: int, err_r: int, req_w: int, rep_r: int,
                 cmd_w: int) -> None:
        super().__init__(context_id, pid, out_r, err_r, req_w, rep_r)
        self.cmd_w = cmd_w

    def fds(self) -> tuple[int, ...]:
        return (*super().fds(), self.cmd_w)


def spawn(agent: Any, context_id: str, cwd: str, start_env: dict[str, str]) -> BashContext:
    cmd_r, cmd_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    # stderr (fd 2) is /dev/null until SETUP's last line moves fd 5 there: an interactive shell
    # without a terminal first complains that it has no job control
    env = {**os.environ, **start_env, "PS1": "", "PS2": "", "PS4": "+ "}
    pid = js_contexts.fork_exec(
        agent, lambda: [cmd_r, out_w, os.open(os.devnull, os.O_WRONLY), req_r, rep_w, err_w],
        [agent.bash, "--noprofile", "--norc", "--noediting", "-i"], env, cwd)
    for fd in (cmd_r, out_w, err_w, req_r, rep_w):
        os.close(fd)
    os.set_blocking(out_r, False)
    os.set_blocking(err_r, False)
    ctx = BashContext(context_id, pid, out_r, err_r, req_w, rep_r, cmd_w)
    try:
        js_contexts.write_all(cmd_w, SETUP)
    except BrokenPipeError:  # it died at once: the cell's write finds it dead and says so
        pass
    return ctx


def ended(agent: Any) -> Any:
    """How a context whose reply pipe closed ended: its real exit status (``exit 3`` is 3)."""

    def status_of(ctx: js_contexts.JsContext) -> dict[str, Any]:
        stop = time.monotonic() + EXIT_WAIT
        while True:
            if ctx.pid in agent.exited:
                status, _ = agent.exited.pop(ctx.pid)
                break
            try:
                got, status = os.waitpid(ctx.pid, os.WNOHANG)
            except ChildProcessError:
                got, status = 0, 0
            if got:
                break
            if time.monotonic() >= stop:  # it closed its reply pipe and lives on: it goes
                procs.kill_tree(ctx.pid, keep=agent._keep_pids() - {ctx.pid})
                return {"exit_code": -9, "signal": 9, "died": True}
            time.sleep(0.005)
        code, sig = procs.decode_status(status)
        return {"exit_code": code, "signal": sig, "died": True}

    return status_of


def run_in_context(agent: Any, context_id: str, spec: dict[str, Any], req: dict[str, Any],
                   result_cap: int):
    """Start a cell in the bash context (spawned on first use, in ``spec['cwd']``)."""
    from .children import RequestError  # noqa: PLC0415 - children imports this module

    if "\x00" in spec["code"]:
        raise RequestError("code must not contain NUL characters", field="code")
    bad = [k for k in spec["env"] if not (k.isascii() and k.isidentifier())]
    if bad:
        raise RequestError(f"env name {bad[0]!r} is not a shell variable name", field="env")
    start_env, _ = procs.request_env_and_cwd(agent.ws, {"env": req.get("start_env")}, RequestError)
    path = os.path.join(agent.tmp, "cell.sh")  # removed with the run's other files
    with open(path, "w", encoding="utf-8") as f:
        f.write(spec["code"])
    data = bytearray(path.encode() + b"\0" + str(len(spec["env"])).encode() + b"\0")
    for name, value in spec["env"].items():
        data += name.encode() + b"\0" + value.encode() + b"\0"

    def make() -> BashContext:
        return spawn(agent, context_id, spec["cwd"], start_env)

    def request_for(ctx: js_contexts.JsContext) -> bytes:
        try:
            js_contexts.write_all(ctx.cmd_w, CELL)  # type: ignore[attr-defined]
        except BrokenPipeError:  # it ended just now: writing the data finds that out too
            pass
        return bytes(data)

    return js_contexts.run_in(agent, agent.sh_contexts, make, context_id, request_for, result_cap,
                              ended(agent))
