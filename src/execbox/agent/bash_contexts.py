"""Stateful bash contexts: a long-lived shell per ``context_id`` whose variables, functions,
aliases, options and working directory persist between cells, as in a Jupyter bash kernel.

The shell is interactive (``-i``, no line editing, no job control, no history), like the one a
bash kernel drives: an error inside a cell (``${x:?}``, an unset variable under ``set -u``, a
syntax error) ends that cell, not the shell. ``exit`` ends the shell, and ``set -e`` with a
failing command does too; the context is then dropped like a timed-out one.

Its pipes (js_contexts.JsContext, plus one): fd 0 takes two fixed command lines per cell,
fd 3 the names of that cell's three files, NUL-terminated (EVAL_CELL; its code; its ``env`` as
NUL-terminated name/value pairs, or an empty name for none: nothing the caller sends is ever
parsed as shell syntax, and no pipe write is larger than a few hundred bytes), fd 4 the reply
line ``{"exit_code":N}``, fds 5 and 6 the context's stderr and stdout for life (the shell's own
fds 1 and 2 are /dev/null). A cell's code is run by ``eval`` in a sourced file (EVAL_CELL) with
fds 3-6 closed, stdout and stderr on the context's pipes and stdin on /dev/null, so the
processes it starts see none of the others. The shell itself keeps saved copies of them while
the cell runs, so a cell can
write its own context's reply early: that only confuses its own results (a reply that is not
well-formed ends the context); it gains nothing a background job in the context lacks.
``env`` is set for the cell and put back after it unless the cell changed it (E2B's
``run_code(envs=...)``).
The request's ``cwd`` and ``start_env`` are where and with what environment a new context
starts (E2B's sandbox ``envs``); after that, ``cd`` and ``export`` in a cell carry over.
"""

from __future__ import annotations

import os
import time

from . import js_contexts, procs, runners
from .lean import dumps

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any

# Sent once to the shell's stdin. The helpers' names start with __execbox_ (env names may not);
# a cell that redefines them, or the builtins they call, breaks only its own context: the run
# times out and the next starts a fresh shell. One that makes their variables readonly ends it.
SETUP = rb"""unset HISTFILE MAILCHECK MAILPATH MAIL PROMPT_COMMAND
set +o history +m +H
__execbox_pre() {
  local - IFS=
  set +u +e
  if [[ ${__execbox_run@a}${__execbox_file@a}${__execbox_envs@a}${__execbox_names@a}${__execbox_new@a} == *r* ||
        ${__execbox_old@a}${__execbox_had@a} == *r* ]]; then
    builtin printf 'execbox: a cell made the shell'"'"'s own __execbox_ variables readonly; this shell ends\n' >&5
    builtin exit 70
  fi
  builtin read -r -d '' __execbox_run <&3 || builtin exit 0
  builtin read -r -d '' __execbox_file <&3 || builtin exit 0
  builtin read -r -d '' __execbox_envs <&3 || builtin exit 0
  __execbox_names=() __execbox_new=() __execbox_old=() __execbox_had=()
  [[ -n $__execbox_envs ]] || builtin return 0
  local __execbox_k __execbox_v
  while builtin read -r -d '' __execbox_k && builtin read -r -d '' __execbox_v; do
    __execbox_names+=("$__execbox_k") __execbox_new+=("$__execbox_v")
    if [[ -n ${!__execbox_k+x} ]]; then
      __execbox_had+=(1) __execbox_old+=("${!__execbox_k}")
    else
      __execbox_had+=(0) __execbox_old+=("")
    fi
    builtin export "$__execbox_k=$__execbox_v"
  done < "$__execbox_envs"
}
__execbox_answer() {
  local - __execbox_rc=$1 __execbox_i=0 __execbox_k
  set +u +e
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
"""
# One cell: the first line reads the cell's data and runs its code (EVAL_CELL) with the cell's stdout
# and stderr (fds 6 and 5); if an error ends that line early, the second still answers (with
# the status the error left). The shell's own stdout and stderr are /dev/null, so what it
# prints between cells (its prompt, a PROMPT_COMMAND a cell set, `set -x` traces of the two
# helpers) reaches no cell's output.
CELL = (b'__execbox_pre; builtin source "$__execbox_run" </dev/null >&6 2>&5 3<&- 4>&- 5>&- 6>&-\n'
        b'__execbox_answer "$?"\n')
# What the cell line sources: the cell's code, run by eval. Sourced, so the shell is not
# interactive while the cell runs (an `exit` prints no "exit", `return` ends the cell); by eval,
# so an error names `eval`, not the file's temp path (`bash: eval: line 3: syntax error ...`).
EVAL_CELL = b'builtin eval -- "$(<"$__execbox_file")"\n'
MAX_ENV_STRING = 128 * 1024 - 1  # execve's limit on one NAME=value string (MAX_ARG_STRLEN)


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
    env = {**os.environ, **start_env, "PS1": "", "PS2": "", "PS4": "+ "}

    def fds() -> list[int]:
        quiet = os.open(os.devnull, os.O_WRONLY)
        return [cmd_r, quiet, quiet, req_r, rep_w, err_w, out_w]

    pid = js_contexts.fork_exec(agent, fds, [agent.bash, "--noprofile", "--norc", "--noediting", "-i"], env, cwd,
                                (cmd_r, cmd_w, out_r, out_w, err_r, err_w, req_r, req_w, rep_r, rep_w))
    for fd in (cmd_r, out_w, err_w, req_r, rep_w):
        os.close(fd)
    for fd in (out_r, err_r, req_w, cmd_w):
        os.set_blocking(fd, False)
    ctx = BashContext(context_id, pid, out_r, err_r, req_w, rep_r, cmd_w)
    try:
        js_contexts.write_all(cmd_w, SETUP, time.monotonic() + 5)  # an empty pipe takes it at once
    except (BrokenPipeError, TimeoutError):  # it died at once: the cell's write finds it dead and says so
        pass
    return ctx


def run_in_context(agent: Any, context_id: str, spec: dict[str, Any], req: dict[str, Any],
                   result_cap: int):
    """Start a cell in the bash context (spawned on first use, in ``spec['cwd']``)."""
    from .children import RequestError  # noqa: PLC0415 - children imports this module

    if "\x00" in spec["code"]:
        raise RequestError("code must not contain NUL characters", field="code")
    bad = [k for k in spec["env"] if not (k.isascii() and k.isidentifier()) or k.startswith("__execbox_")]
    if bad:
        raise RequestError(f"env name {bad[0]!r} is not a shell variable name a cell may set", field="env")
    start_env, _ = procs.request_env_and_cwd(agent.ws, {"env": req.get("start_env")}, RequestError)
    for name, value in start_env.items():
        if name.startswith("__execbox_") or len(name) + len(value) + 2 > MAX_ENV_STRING:
            raise RequestError(f"start_env {name[:64]!r}: the name is reserved or the entry is longer than "
                               f"{MAX_ENV_STRING} bytes", field="start_env")
    code_path = agent.run_file(".sh", spec["code"].encode())
    env = dict(spec["env"])
    if spec.get("arguments") is not None:  # as a one-shot bash run gets them
        env[runners.ARGUMENTS_ENV] = agent.run_file(".json", dumps(spec["arguments"]).encode())
    env_path = ""
    if env:
        env_path = agent.run_file(".env", b"".join(
            k.encode() + b"\0" + v.encode() + b"\0" for k, v in env.items()))
    run_path = agent.run_file(".sh", EVAL_CELL)
    data = run_path.encode() + b"\0" + code_path.encode() + b"\0" + env_path.encode() + b"\0"

    def make() -> BashContext:
        return spawn(agent, context_id, spec["cwd"], start_env)

    def request_for(ctx: js_contexts.JsContext, deadline: float) -> bytes:
        try:
            js_contexts.write_all(ctx.cmd_w, CELL, deadline)  # type: ignore[attr-defined]
        except BrokenPipeError:  # it ended just now: writing the data finds that out too
            pass
        return data

    return js_contexts.run_in(agent, agent.sh_contexts, make, context_id, request_for, spec["timeout"],
                              result_cap)
