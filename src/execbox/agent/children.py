"""Forking the agent's children: one-shot runs (each in a spare, spares.py) and contexts.

Split from main.py (the protocol loop) along the process seam: everything here creates, feeds,
reaps or kills a child process; main.py only reads requests and dispatches them.
"""

from __future__ import annotations

import os
import time

from . import bash_contexts, contexts, fileops, js_contexts, privsep, procs, protocol, pump
from .lean import dumps, signal
from .spares import EARLY_SPARE_MAX_FORK, FIGURE_WORDS, Spares

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any

LANGS = ("python", "javascript", "bash")
ALIASES = {"nodejs": "javascript", "node": "javascript", "js": "javascript", "python3": "python",
           "py": "python", "sh": "bash", "shell": "bash"}


class RequestError(Exception):
    def __init__(self, message: str, status: int = 400, code: str = "SB002", **details: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.details = status, code, details


class Children(Spares):
    """Mixin for :class:`execbox.agent.main.Agent`: the state it uses is set up in ``Agent.__init__``."""

    # -- children ---------------------------------------------------------------------------
    def child_prepare(self, ignore_sigint: bool = False) -> None:
        """First thing in every forked child: forget the protocol and the agent's signals. A
        context ignores SIGINT until a cell runs (its interrupt, contexts.context_main)."""
        privsep.drop_user_code()  # the sandbox uid, no capabilities, before anything else runs
        procs.set_dumpable(True)  # an ordinary process again (its own /proc entries readable)
        procs.prefer_oom_kill()  # after set_dumpable: /proc/self is then the sandbox user's to write
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGINT, signal.SIGTERM):
            ignore = ignore_sigint and sig == signal.SIGINT  # never SIG_DFL on the way: that ends it
            signal.signal(sig, signal.SIG_IGN if ignore else signal.SIG_DFL)
        for fd in (self.proto_in, self.proto_out, self.wake_r, self.wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        for ctx in self.contexts.values():
            ctx.sock.close()
        for fd in [fd for c in self._pipe_contexts() for fd in c.fds()] + self.bg.parent_fds():
            try:  # a JS or bash context's pipes; background stdin: EOF must not wait for this child
                os.close(fd)
            except OSError:
                pass
        if self.spare is not None:  # another child must not feed or read the waiting spare
            for fd in self.spare.fds():
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.setsid()

    def _exec_request(self, req: dict[str, Any]) -> dict[str, Any]:
        lang = ALIASES.get(str(req.get("language", "python")).lower(), str(req.get("language", "python")).lower())
        if lang not in LANGS:
            raise RequestError(f"unknown language {req.get('language')!r}", field="language")
        if lang == "javascript" and not self.node:
            raise RequestError("javascript is not available in this box (node not found)", status=400,
                               field="language")
        code = req.get("code")
        if not isinstance(code, str):
            raise RequestError("code must be a string", field="code")
        args = req.get("arguments")
        if args is not None and not isinstance(args, dict):
            raise RequestError("arguments must be a JSON object", field="arguments")
        timeout = req.get("timeout", 30)
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise RequestError("timeout must be a positive number of seconds", field="timeout")
        env, cwd = procs.request_env_and_cwd(self.ws, req, RequestError)
        return {"language": lang, "code": code, "arguments": args, "timeout": float(timeout),
                "env": env, "cwd": cwd}

    def op_exec(self, rid: Any, req: dict[str, Any]) -> dict[str, Any]:
        spec = self._exec_request(req)
        self.seq += 1
        prefix = f"figure-{self.seq}"
        cap = int(req.get("output_cap") or pump.DEFAULT_OUTPUT_CAP)
        emit = None
        if req.get("stream"):
            def emit(name: str, text: str) -> None:
                self.send({"id": rid, "event": name, "data": text})
        context_id = req.get("context_id")
        before = pump.snapshot(self.artifacts)
        start = time.monotonic()
        ctx_note: dict[str, Any] = {}
        read_fds: tuple[int, ...] = ()
        js_state: dict[str, Any] | None = None
        try:
            if context_id is not None and spec["language"] in ("javascript", "bash"):
                js_lang = spec["language"] == "javascript"
                start_cell = js_contexts.run_in_context if js_lang else bash_contexts.run_in_context
                watch, kill, ctx_note, js_state = start_cell(self, str(context_id), spec, req, result_cap=cap)
                res_r, res_w = os.pipe()  # results come with the context's reply, not on a pipe
                os.close(res_w)
                read_fds = (res_r,)
                js = (self.js_contexts if js_lang else self.sh_contexts)[str(context_id)]
                out_r, err_r = js.out_r, js.err_r
            elif context_id is not None:
                out_r, out_w = os.pipe()
                err_r, err_w = os.pipe()
                res_r, res_w = os.pipe()
                read_fds = (out_r, err_r, res_r)
                try:
                    watch, kill, ctx_note = self._start_in_context(str(context_id), spec, req, prefix,
                                                                   (out_w, err_w, res_w))
                finally:
                    for fd in (out_w, err_w, res_w):
                        os.close(fd)
            else:
                watch, kill, read_fds = self._start_oneshot(spec, req, prefix)
            if js_state is None:
                out_r, err_r, res_r = read_fds
            streams = [pump.Stream("stdout", out_r, cap, emit), pump.Stream("stderr", err_r, cap, emit)]
            out = pump.pump(
                watch, streams, res_r, start + spec["timeout"], self.wake_r, self.proto_in,
                lambda data: self._on_control(rid, data), self.on_wake, kill, self._cancel_waiting(rid),
                result_cap=cap,
            )
        finally:
            for fd in read_fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._cleanup_run_files()
        elapsed = time.monotonic() - start
        ctx_note.pop("spare_ended", None)
        if ctx_note.pop("context_interrupted", False) and not out["exit"].get("died"):
            why = "timeout" if out["timed_out"] else "cancelled"
            ctx_note["context_note"] = f"context {context_id!r} was interrupted ({why}); its state is kept"
        elif context_id is not None and (out["timed_out"] or out["cancelled"] or out["exit"].get("died")):
            self._drop_context(str(context_id), self._context_table(spec["language"]))
            ctx_note["context_reset"] = True
            ctx_note["context_note"] = (f"context {context_id!r} {_how_ended(out)}; its state is lost and the "
                                        "next run starts fresh")
        where = out if js_state is None else js_state
        overflow = bool(where.get("result_overflow"))
        result, oom_marker, waits, error = ((None, False, None, None) if overflow
                                            else pump.parse_result(where.get("result_raw", b"")))
        if error is not None and (spec["language"] == "bash" or not out["exit"].get("exit_code")):
            error = None  # bash has none (its exit code says it); a run that exited 0 raised nothing
        elif error is not None and cap < pump.ERROR_TEXT_CAP:  # never more than the output cap lets stderr hold
            error = pump.error_record(error, cap)
        result, result_note = pump.cap_result(result, cap, overflow, int(where.get("result_bytes") or 0))
        artifacts, skipped = pump.collect_artifacts(self.artifacts, before, "artifacts",
                                                    bool(req.get("inline_artifacts")))
        stderr = streams[1].text()
        for note in (result_note, pump.skipped_artifacts_note(skipped)):
            if note:
                stderr += note
                if emit is not None:
                    emit("stderr", note)
        oom = oom_marker or pump.looks_oom(stderr, out["exit"])
        if self.figures_preloaded and not self.draws_figures and spec["language"] == "python":
            self.draws_figures = any(a["name"].startswith(prefix + "-") for a in artifacts) or any(
                word in spec["code"] for word in FIGURE_WORDS)
        if waits and out["timed_out"]:  # what a program that timed out after its code finished waited for
            ctx_note["exit_waits_for"] = waits
        return {
            "stdout": streams[0].text(), "stderr": stderr,
            "exit_code": out["exit"].get("exit_code", -9), "signal": out["exit"].get("signal"),
            "timed_out": out["timed_out"], "cancelled": out["cancelled"],
            "truncated": streams[0].truncated or streams[1].truncated or bool(result_note),
            "execution_time": elapsed, "result": result, "error": error, "oom": oom,
            "peak_memory_kb": out["exit"].get("peak_memory_kb"), "artifacts": artifacts,
            "language": spec["language"], **ctx_note,
        }

    def _cancel_waiting(self, rid: Any) -> bool:
        """Whether a cancel of run ``rid`` was read before its pump started (in ``pending``)."""
        mine = [m for m in self.pending if m.get("op") == "cancel" and m.get("target") == rid]
        for msg in mine:
            self.pending.remove(msg)
        return bool(mine)

    def _on_control(self, rid: Any, data: bytes) -> bool:
        cancel = False
        for msg in self.frames.feed(data):
            # "*": whatever runs (a new owner re-attaching to a box whose run's requester is gone)
            if msg.get("op") == "cancel" and msg.get("target") in (rid, "*"):
                cancel = True
            elif msg.get("op") == "cancel":
                continue
            elif msg.get("op") in protocol.BESIDE_RUN:
                self.handle(msg)  # background-process and file ops never wait for the run to end
            else:
                self.pending.append(msg)
        if not data:
            cancel = True  # the host is gone: stop the run
        return cancel

    def run_file(self, suffix: str, data: bytes) -> str:
        """A file for this run in the agent's temp dir, removed with the run's other files.

        A fresh, unguessable name, created here: user code runs as the agent's uid and can
        write to that dir, but a FIFO it planted (which would block the agent's open) or a
        symlink (which would send the write elsewhere) is never this file."""
        path = os.path.join(self.tmp, f"run-{os.urandom(8).hex()}{suffix}")
        fileops.write_file(path, data)
        return path

    def _cleanup_run_files(self) -> None:
        for name in os.listdir(self.tmp):
            try:
                os.unlink(os.path.join(self.tmp, name))
            except OSError:
                pass

    def _start_oneshot(self, spec: dict[str, Any], req: dict[str, Any], prefix: str):
        lang = spec["language"]
        code_path = args_path = ""
        if lang != "python":
            code_path = self.run_file(".js" if lang == "javascript" else ".sh", spec["code"].encode())
            if spec["arguments"] is not None:
                args_path = self.run_file(".json", dumps(spec["arguments"]).encode())
        limits = dict(self.limits)
        limits.update({k: v for k, v in (req.get("limits") or {}).items() if v})
        job = {"spec": spec, "stream": bool(req.get("stream")), "prefix": prefix, "code_path": code_path,
               "args_path": args_path, "limits": limits}
        for _attempt in range(2):
            spare = self._take_spare()
            try:
                protocol.write_frame(spare.ctl_w, job)
            except OSError:  # the spare died while waiting (killed from inside the box): fork anew
                self._drop(spare)
                continue
            os.close(spare.ctl_w)
            if spare.ready_r >= 0:
                os.close(spare.ready_r)
            break
        else:
            raise RequestError("could not start a child process for the run", status=503, code="SB009")
        # From a box's second run on, the next run's spare warms up while this one runs:
        # back-to-back session runs then find it ready instead of waiting for its fork
        # and warm-up. Not on a box's first run, which may be its only one (a one-shot),
        # and not where fork() itself is slow (gVisor: tens of ms, which the agent would
        # spend blocked while the run waits for its reply): there the spare is forked
        # after the reply, off the run's critical path, as before.
        if self.seq > 1 and self.fork_cost is not None and self.fork_cost < EARLY_SPARE_MAX_FORK:
            self.make_spare()
        pid = spare.pid

        def done() -> dict[str, Any] | None:
            if pid not in self.exited:
                return None
            status, ru = self.exited.pop(pid)
            code, sig = procs.decode_status(status)
            return {"exit_code": code, "signal": sig, "peak_memory_kb": ru.ru_maxrss}

        def kill() -> None:
            procs.kill_tree(pid, keep=self._keep_pids())

        def reap_and_clean() -> dict[str, Any] | None:
            info = done()
            if info is not None:
                # The main process ended: whatever it left running in the background ends too.
                procs.kill_tree(pid, keep=self._keep_pids())
            return info

        def finished(result_raw: bytes) -> dict[str, Any] | None:
            """Done before the reap: the Python child wrote its exit record and closed its pipes.

            Its exit (freeing a forked interpreter's pages) and the SIGCHLD round trip took
            ~1.4 ms of every run; the reply no longer waits for them. The record comes from the
            run's own process, so code can only misreport its own exit code (as sys.exit can);
            it is killed here all the same, and its late exit status is dropped by ``on_wake``.
            """
            if pid in self.exited:
                return None  # already reaped: the real status wins
            info = pump.exit_record(result_raw)
            if info is None:
                return None
            self.detached.add(pid)
            procs.kill_tree(pid, keep=self._keep_pids() | {pid})  # its group and descendants
            self.reap_detached()  # it may have exited before it was listed: no SIGCHLD is coming
            return info

        watch = pump.Watch(pid=pid, is_done=reap_and_clean, finished=finished if lang == "python" else None)
        return watch, kill, (spare.out_r, spare.err_r, spare.res_r)

    def _context_pids(self) -> set[int]:
        return {c.pid for c in self.contexts.values()}

    def _keep_pids(self) -> set[int]:
        """Children that outlive a run: contexts, background processes and the waiting spare."""
        keep = self._context_pids() | self.bg.pids() | {c.pid for c in self._pipe_contexts()}
        if self.spare is not None:
            keep.add(self.spare.pid)
        return keep

    def _context_table(self, language: str) -> dict[str, Any]:
        return {"python": self.contexts, "javascript": self.js_contexts, "bash": self.sh_contexts}[language]

    def _check_context_room(self) -> None:
        tables = (self.contexts, self.js_contexts, self.sh_contexts)
        if sum(map(len, tables)) >= contexts.MAX_CONTEXTS:  # ended ones hold no room
            for table in tables:
                for cid, ctx in list(table.items()):
                    if self._context_ended(ctx.pid):
                        self._drop_context(cid, table)
        if sum(map(len, tables)) >= contexts.MAX_CONTEXTS:
            raise RequestError(f"too many contexts (max {contexts.MAX_CONTEXTS}); reset one first",
                               status=429, code="SB008", field="context_id")

    def _spawn_context(self, context_id: str) -> contexts.Context:
        self._check_context_room()
        import socket  # noqa: PLC0415 - contexts only: kept off the box's start-up path

        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = procs.fork("a context")
        except procs.NoRoomForProcess:
            parent.close()
            child.close()
            raise
        if pid == 0:
            try:
                self.child_prepare(ignore_sigint=True)  # an interrupt before any cell is nothing
                procs.close_fds_except((child.fileno(),))
                procs.apply_rlimits(self.limits)
                contexts.context_main(child, self.ws, self.artifacts)
            finally:
                os._exit(0)
        self.exited.pop(pid, None)  # a reused pid's old status is not this child's
        child.close()
        ctx = contexts.Context(context_id, pid, parent)
        self.contexts[context_id] = ctx
        return ctx

    def _pipe_contexts(self) -> list[js_contexts.JsContext]:
        """The JS and bash contexts: each a long-lived process with pipes of its own."""
        return [*self.js_contexts.values(), *self.sh_contexts.values()]

    def _context_ended(self, pid: int) -> bool:
        """Whether a context's process has ended since its last cell (reaped here if so)."""
        self.on_wake()
        return self.exited.pop(pid, None) is not None

    def _drop_context(self, context_id: str, only: dict[str, Any] | None = None) -> None:
        """End the contexts named ``context_id``: all languages' (``context.reset``), or only
        the one in table ``only`` (a run that timed out or died: the others live on)."""
        for table in (self.js_contexts, self.sh_contexts):
            js = table.pop(context_id, None) if only is None or only is table else None
            if js is not None:
                js_contexts.close(js, self._keep_pids())
                self.reset_contexts.add((id(table), context_id))
        ctx = self.contexts.pop(context_id, None) if only is None or only is self.contexts else None
        if ctx is not None:
            pump.kill_quietly(ctx.pid, keep=self._keep_pids())  # other contexts live on
            ctx.sock.close()
            self.reset_contexts.add((id(self.contexts), context_id))

    def _start_in_context(self, context_id: str, spec: dict[str, Any], req: dict[str, Any], prefix: str,
                          write_fds: tuple[int, int, int]):
        note: dict[str, Any] = {"context_id": context_id}
        ctx = self.contexts.get(context_id)
        if ctx is not None and self._context_ended(ctx.pid):  # after its last reply (a late exit)
            self._drop_context(context_id, self.contexts)
            ctx = None
        if ctx is None:
            ctx = self._spawn_context(context_id)
            note["context_new"] = True
            if (id(self.contexts), context_id) in self.reset_contexts:
                self.reset_contexts.discard((id(self.contexts), context_id))
                note["context_restarted"] = True
                note["context_note"] = js_contexts.RESTARTED
        ctx.executions += 1
        note["context_executions"] = ctx.executions
        import socket  # noqa: PLC0415 - loaded once the first context started

        # a one-shot run in a spare context (Docker's warm start) is a file python3 runs, not a cell
        cell = not req.get("script")
        socket.send_fds(ctx.sock, [b"x"], list(write_fds))
        protocol.write_frame(ctx.sock.fileno(), {
            "code": spec["code"], "arguments": spec["arguments"], "cwd": spec["cwd"],
            "stream": bool(req.get("stream")), "figure_prefix": prefix, "cell": cell,
        })
        state: dict[str, Any] = {}
        stop = pump.Interrupt(ctx.pid, lambda: self._keep_pids() - {ctx.pid})

        def on_extra(fd: int) -> None:
            try:
                msg = protocol.read_frame(fd)
                state["done"] = {"exit_code": msg.get("exit_code", 1), "signal": None,
                                 "peak_memory_kb": msg.get("peak_memory_kb")}
                if stop.pending:  # the cell answered its interrupt: the context lives on
                    note["context_interrupted"] = True
            except (EOFError, OSError, ValueError):  # it ended (os._exit(4) is 4, not a kill)
                state["done"] = js_contexts.exit_status(self, ctx)

        def done() -> dict[str, Any] | None:
            if "done" in state:
                if not cell and not note.get("spare_ended"):
                    end_spare()
                return state["done"]
            if ctx.pid in self.exited:
                return procs.died(*self.exited.pop(ctx.pid))
            stop.tick()
            return None

        def end_spare() -> None:
            """A one-shot run in a spare context answered: the spare (it serves this one run) and
            what the run left running in its process group (a Popen'd child, a shell's job) end
            now, before the reply, as a forked one-shot run's leftovers do (reap_and_clean). The
            host's context.reset of the used spare comes later, from another thread, after the
            caller already has the reply: a leftover kept writing meanwhile (conformance:
            background_ends_with_run on docker-runsc). One killpg here (the spare leads its own
            session); the reset's full kill_tree still ends what left the group (a setsid daemon)
            and closes the context. Dead here, the leftovers also close the run's pipes: no drain
            grace is waited out."""
            note["spare_ended"] = True
            try:
                os.killpg(ctx.pid, signal.SIGKILL)
            except OSError:
                pass
            self.detached.add(ctx.pid)  # its exit status is nobody's: dropped by on_wake

        def kill() -> None:
            # A notebook's interrupt first (contexts.context_main): KeyboardInterrupt in the cell,
            # its globals kept; a context that has not answered within the grace is killed.
            if not cell:  # a one-shot's spare: killed at once, as any one-shot run
                pump.kill_quietly(ctx.pid, keep=self._keep_pids() - {ctx.pid})
                return
            stop.start()

        return pump.Watch(pid=ctx.pid, is_done=done, extra_fds=[ctx.sock.fileno()], on_extra=on_extra), kill, note


def _how_ended(out: dict[str, Any]) -> str:
    """What ended a context, for its note: a kill by execbox, a signal, or its own exit."""
    if out["timed_out"] or out["cancelled"]:
        return f"was killed ({'timeout' if out['timed_out'] else 'cancelled'})"
    if out["exit"].get("signal"):
        return f"was killed by signal {out['exit']['signal']}"
    return f"ended (exit code {out['exit'].get('exit_code')})"
