"""The agent's zygote loop: pre-import, then serve framed requests, forking per execution.

Started by every self-hosted backend as the box's main process with the protocol on stdin and
stdout. It moves the protocol to private fds and points 0/1 at /dev/null, so nothing the user's
code prints can corrupt the stream, and children close those fds before running user code.
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any

from . import contexts, executor, fileops, paths, privsep, procs, protocol, runners

AGENT_VERSION = "1"
LANGS = ("python", "javascript", "bash")
ALIASES = {"nodejs": "javascript", "node": "javascript", "js": "javascript", "python3": "python",
           "py": "python", "sh": "bash", "shell": "bash"}
AUTO_PRELOAD = ("numpy", "pandas", "matplotlib.pyplot")


@dataclass
class Spare:
    """A forked child waiting for its one-shot job on ``ctl_w``."""

    pid: int
    out_r: int
    err_r: int
    res_r: int
    ctl_w: int


class RequestError(Exception):
    def __init__(self, message: str, status: int = 400, code: str = "SB002", **details: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.details = status, code, details


class Agent:
    def __init__(self, workspace: str, preload: list[str], limits: dict[str, Any]) -> None:
        self.t0 = time.monotonic()
        self.proto_in = os.dup(0)
        self.proto_out = os.dup(1)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.close(devnull)
        os.makedirs(workspace, exist_ok=True)
        self.ws = os.path.realpath(workspace)
        self.artifacts = os.path.join(self.ws, "artifacts")
        os.makedirs(self.artifacts, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix="execbox-agent-")
        self.limits = limits
        self.node = shutil.which("node") or shutil.which("nodejs")
        self.bash = shutil.which("bash") or "/bin/bash"
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.exited: dict[int, tuple[int, Any]] = {}
        self.contexts: dict[str, contexts.Context] = {}
        self.reset_contexts: set[str] = set()
        self.frames = protocol.FrameBuffer()
        self.pending: collections.deque[dict[str, Any]] = collections.deque()
        self.subreaper = procs.become_subreaper()
        procs.set_dumpable(False)  # user code (same uid) must not reach our fds through /proc
        self.preloaded = self._preload(preload)
        self.seq = 0
        self.spare: Spare | None = None
        # Everything imported so far is shared with every fork: keep the collector from touching
        # (and so copying) those pages in each child.
        gc.collect()
        gc.freeze()

    # -- start-up ---------------------------------------------------------------------------
    @staticmethod
    def _preload(names: list[str]) -> list[str]:
        done = []
        for name in names:
            root = name.split(".")[0]
            if importlib.util.find_spec(root) is None:
                continue
            try:
                if root == "matplotlib":
                    import matplotlib

                    matplotlib.use("Agg")
                importlib.import_module(name)
                done.append(name)
            except Exception:  # noqa: BLE001 - a broken optional library must not stop the agent
                continue
        return done

    def languages(self) -> list[str]:
        return [lang for lang in LANGS if lang != "javascript" or self.node]

    # -- protocol ---------------------------------------------------------------------------
    def send(self, message: dict[str, Any]) -> None:
        protocol.write_frame(self.proto_out, message)

    def next_request(self) -> dict[str, Any] | None:
        while not self.pending:
            data = os.read(self.proto_in, 1 << 20)
            if not data:
                return None
            self.pending.extend(self.frames.feed(data))
        return self.pending.popleft()

    def serve(self) -> None:
        self.send({
            "event": "ready", "version": AGENT_VERSION, "protocol": protocol.PROTOCOL_VERSION,
            "pid": os.getpid(), "uid": os.getuid(), "python": sys.version.split()[0],
            "languages": self.languages(), "preloaded": self.preloaded, "workspace": self.ws,
            "subreaper": self.subreaper, "privsep": privsep.mode(),
            "startup_ms": round((time.monotonic() - self.t0) * 1000, 1),
        })
        self.make_spare()
        while True:
            req = self.next_request()
            if req is None:
                break
            if not self.handle(req):
                break
            if not self.pending:
                self.make_spare()
        self.shutdown()

    def handle(self, req: dict[str, Any]) -> bool:
        rid = req.get("id")
        op = req.get("op")
        try:
            if op == "shutdown":
                self.send({"id": rid, "ok": True, "value": {}})
                return False
            handler = OPS.get(op)
            if handler is None:
                raise RequestError(f"unknown operation {op!r}", field="op")
            value = handler(self, rid, req)
            self.send({"id": rid, "ok": True, "value": value})
        except (RequestError, fileops.FileOpError) as e:
            self.send({"id": rid, "ok": False, "error": {
                "code": e.code, "status": e.status, "message": str(e), "details": e.details}})
        except Exception as e:  # noqa: BLE001 - report, keep serving
            self.send({"id": rid, "ok": False, "error": {
                "code": "SB009", "status": 503, "message": f"agent error: {type(e).__name__}: {e}",
                "details": {"traceback": traceback.format_exc(limit=5)}}})
        return True

    def on_wake(self) -> None:
        for pid, status, ru in procs.reap_all():
            self.exited[pid] = (status, ru)

    def shutdown(self) -> None:
        self._discard_spare()
        for ctx in list(self.contexts.values()):
            executor.kill_quietly(ctx.pid)
        procs.kill_tree(os.getpid(), include_root=False)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- children ---------------------------------------------------------------------------
    def child_prepare(self) -> None:
        """First thing in every forked child: forget the protocol and the agent's signals."""
        privsep.drop_user_code()  # the sandbox uid, no capabilities, before anything else runs
        procs.set_dumpable(True)  # an ordinary process again (its own /proc entries readable)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        for fd in (self.proto_in, self.proto_out, self.wake_r, self.wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        for ctx in self.contexts.values():
            ctx.sock.close()
        if self.spare is not None:  # another child must not feed or read the waiting spare
            for fd in (self.spare.ctl_w, self.spare.out_r, self.spare.err_r, self.spare.res_r):
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
        env = req.get("env") or {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\x00" not in k + v
            for k, v in env.items()
        ):
            raise RequestError("env must map names to string values", field="env")
        try:
            cwd = paths.resolve(self.ws, req.get("cwd") or ".")
        except paths.PathViolation as e:
            raise RequestError(str(e), field="cwd", violation=e.reason) from None
        if not os.path.isdir(cwd):
            raise RequestError(f"cwd {req.get('cwd')!r} is not a directory", field="cwd")
        return {"language": lang, "code": code, "arguments": args, "timeout": float(timeout),
                "env": env, "cwd": cwd}

    def op_exec(self, rid: Any, req: dict[str, Any]) -> dict[str, Any]:
        spec = self._exec_request(req)
        self.seq += 1
        prefix = f"figure-{self.seq}"
        cap = int(req.get("output_cap") or executor.DEFAULT_OUTPUT_CAP)
        emit = None
        if req.get("stream"):
            def emit(name: str, text: str) -> None:
                self.send({"id": rid, "event": name, "data": text})
        context_id = req.get("context_id")
        if context_id is not None and spec["language"] != "python":
            raise RequestError("context_id is supported for python only", field="context_id")
        before = executor.snapshot(self.artifacts)
        start = time.monotonic()
        ctx_note: dict[str, Any] = {}
        read_fds: tuple[int, ...] = ()
        try:
            if context_id is not None:
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
            out_r, err_r, res_r = read_fds
            streams = [executor.Stream("stdout", out_r, cap, emit), executor.Stream("stderr", err_r, cap, emit)]
            out = executor.pump(
                watch, streams, res_r, start + spec["timeout"], self.wake_r, self.proto_in,
                lambda data: self._on_control(rid, data), self.on_wake, kill,
            )
        finally:
            for fd in read_fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._cleanup_run_files()
        elapsed = time.monotonic() - start
        if context_id is not None and (out["timed_out"] or out["cancelled"] or out["exit"].get("died")):
            self._drop_context(str(context_id))
            ctx_note["context_reset"] = True
            ctx_note["context_note"] = (f"context {context_id!r} was killed "
                                        f"({'timeout' if out['timed_out'] else 'ended'}); "
                                        "its state is lost and the next run starts fresh")
        result, oom_marker = executor.parse_result(out["result_raw"])
        stderr = streams[1].text()
        oom = oom_marker or executor.looks_oom(stderr, out["exit"])
        artifacts = executor.collect_artifacts(self.artifacts, before, "artifacts",
                                               bool(req.get("inline_artifacts")))
        return {
            "stdout": streams[0].text(), "stderr": stderr,
            "exit_code": out["exit"].get("exit_code", -9), "signal": out["exit"].get("signal"),
            "timed_out": out["timed_out"], "cancelled": out["cancelled"],
            "truncated": streams[0].truncated or streams[1].truncated,
            "execution_time": elapsed, "result": result, "oom": oom,
            "peak_memory_kb": out["exit"].get("peak_memory_kb"), "artifacts": artifacts,
            "language": spec["language"], **ctx_note,
        }

    def _on_control(self, rid: Any, data: bytes) -> bool:
        cancel = False
        for msg in self.frames.feed(data):
            if msg.get("op") == "cancel" and msg.get("target") == rid:
                cancel = True
            elif msg.get("op") == "cancel":
                continue
            else:
                self.pending.append(msg)
        if not data:
            cancel = True  # the host is gone: stop the run
        return cancel

    def _cleanup_run_files(self) -> None:
        for name in os.listdir(self.tmp):
            try:
                os.unlink(os.path.join(self.tmp, name))
            except OSError:
                pass

    def make_spare(self) -> None:
        """Fork the child for the next one-shot run ahead of time, off the request's hot path.

        The spare has its pipes wired and waits on a control pipe for its job; fork cost and
        copy-on-write set-up are paid while the host is busy with the previous reply.
        """
        if self.spare is not None:
            return
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        res_r, res_w = os.pipe()
        ctl_r, ctl_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the spare child
            try:
                self.child_prepare()
                for fd in (out_r, err_r, res_r, ctl_w):
                    os.close(fd)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                os.close(out_w)
                os.close(err_w)
                runners.warm_up()
                try:
                    job = protocol.read_frame(ctl_r)
                except (EOFError, OSError, ValueError):
                    os._exit(0)  # discarded unused
                os.close(ctl_r)
                self._child_run(job, res_w)
            except BaseException:  # noqa: BLE001
                try:
                    os.write(2, traceback.format_exc().encode())
                finally:
                    os._exit(127)
            os._exit(1)
        for fd in (out_w, err_w, res_w, ctl_r):
            os.close(fd)
        self.spare = Spare(pid, out_r, err_r, res_r, ctl_w)

    def _discard_spare(self) -> None:
        spare, self.spare = self.spare, None
        if spare is None:
            return
        for fd in (spare.ctl_w, spare.out_r, spare.err_r, spare.res_r):
            try:
                os.close(fd)
            except OSError:
                pass
        executor.kill_quietly(spare.pid, keep=self._keep_pids())

    def _child_run(self, job: dict[str, Any], res_w: int) -> None:
        """Body of a one-shot child once its job arrived; never returns."""
        spec = job["spec"]
        lang = spec["language"]
        os.chdir(spec["cwd"])
        env = dict(os.environ)
        env.update(spec["env"])
        if job["args_path"]:
            env["EXECBOX_ARGUMENTS_FILE"] = job["args_path"]
        limits = job["limits"]
        procs.apply_rlimits(limits, allow_address_space=lang != "javascript")
        if lang == "python":
            os.environ.update(spec["env"])
            runners.setup_stdio(bool(job["stream"]))
            rc = runners.run_python(spec["code"], spec["arguments"], {}, res_w, self.artifacts, job["prefix"])
            runners.flush_stdio()
            os._exit(rc & 0xFF if rc >= 0 else 1)
        if lang == "javascript":
            os.dup2(res_w, 3)
            os.set_inheritable(3, True)
            heap = limits.get("memory_bytes")
            runners.exec_node(self.node or "node", job["code_path"], job["args_path"], env,
                              int(heap // (1024 * 1024) * 3 // 4) if heap else None)
        runners.exec_bash(self.bash, job["code_path"], env)

    def _start_oneshot(self, spec: dict[str, Any], req: dict[str, Any], prefix: str):
        lang = spec["language"]
        code_path = args_path = ""
        if lang != "python":
            code_path = os.path.join(self.tmp, "code.js" if lang == "javascript" else "script.sh")
            with open(code_path, "w", encoding="utf-8") as f:
                f.write(spec["code"])
            if spec["arguments"] is not None:
                args_path = os.path.join(self.tmp, "arguments.json")
                with open(args_path, "w", encoding="utf-8") as f:
                    json.dump(spec["arguments"], f)
        limits = dict(self.limits)
        limits.update({k: v for k, v in (req.get("limits") or {}).items() if v})
        job = {"spec": spec, "stream": bool(req.get("stream")), "prefix": prefix, "code_path": code_path,
               "args_path": args_path, "limits": limits}
        for _attempt in range(2):
            self.make_spare()
            spare, self.spare = self.spare, None
            assert spare is not None
            try:
                protocol.write_frame(spare.ctl_w, job)
                os.close(spare.ctl_w)
                break
            except OSError:  # the spare died while waiting (killed from inside the box): fork anew
                self.spare = spare
                self._discard_spare()
        else:
            raise RequestError("could not start a child process for the run", status=503, code="SB009")
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

        return executor.Watch(pid=pid, is_done=reap_and_clean), kill, (spare.out_r, spare.err_r, spare.res_r)

    def _context_pids(self) -> set[int]:
        return {c.pid for c in self.contexts.values()}

    def _keep_pids(self) -> set[int]:
        """Children that outlive a run: contexts and the waiting spare."""
        keep = self._context_pids()
        if self.spare is not None:
            keep.add(self.spare.pid)
        return keep

    def _spawn_context(self, context_id: str) -> contexts.Context:
        if len(self.contexts) >= contexts.MAX_CONTEXTS:
            raise RequestError(f"too many contexts (max {contexts.MAX_CONTEXTS}); reset one first",
                               status=429, code="SB008", field="context_id")
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            try:
                self.child_prepare()
                parent.close()
                procs.apply_rlimits(self.limits)
                contexts.context_main(child, self.ws, self.artifacts)
            finally:
                os._exit(0)
        child.close()
        ctx = contexts.Context(context_id, pid, parent)
        self.contexts[context_id] = ctx
        return ctx

    def _drop_context(self, context_id: str) -> None:
        ctx = self.contexts.pop(context_id, None)
        if ctx is not None:
            executor.kill_quietly(ctx.pid, keep=self._keep_pids())  # other contexts live on
            ctx.sock.close()
            self.reset_contexts.add(context_id)

    def _start_in_context(self, context_id: str, spec: dict[str, Any], req: dict[str, Any], prefix: str,
                          write_fds: tuple[int, int, int]):
        note: dict[str, Any] = {"context_id": context_id}
        ctx = self.contexts.get(context_id)
        if ctx is None:
            ctx = self._spawn_context(context_id)
            note["context_new"] = True
            if context_id in self.reset_contexts:
                self.reset_contexts.discard(context_id)
                note["context_restarted"] = True
                note["context_note"] = "this context was restarted after a timeout; earlier state is gone"
        ctx.executions += 1
        note["context_executions"] = ctx.executions
        socket.send_fds(ctx.sock, [b"x"], list(write_fds))
        protocol.write_frame(ctx.sock.fileno(), {
            "code": spec["code"], "arguments": spec["arguments"], "cwd": spec["cwd"],
            "stream": bool(req.get("stream")), "figure_prefix": prefix,
        })
        state: dict[str, Any] = {}

        def on_extra(fd: int) -> None:
            try:
                msg = protocol.read_frame(fd)
                state["done"] = {"exit_code": msg.get("exit_code", 1), "signal": None,
                                 "peak_memory_kb": msg.get("peak_memory_kb")}
            except (EOFError, OSError, ValueError):
                state["done"] = {"exit_code": -9, "signal": 9, "died": True}

        def done() -> dict[str, Any] | None:
            if "done" in state:
                return state["done"]
            if ctx.pid in self.exited:
                status, _ = self.exited.pop(ctx.pid)
                code, sig = procs.decode_status(status)
                return {"exit_code": code, "signal": sig, "died": True}
            return None

        def kill() -> None:
            executor.kill_quietly(ctx.pid, keep=self._keep_pids() - {ctx.pid})

        return executor.Watch(pid=ctx.pid, is_done=done, extra_fds=[ctx.sock.fileno()], on_extra=on_extra), kill, note

    # -- files ------------------------------------------------------------------------------
    def op_files(self, rid: Any, req: dict[str, Any]) -> Any:
        op = req["op"]
        ws = self.ws
        if op == "files.read":
            return fileops.read_text(ws, req.get("path", ""), int(req.get("offset", 0)), int(req.get("limit", 2000)))
        if op == "files.read_bytes":
            import base64

            data = fileops.read_bytes(ws, req.get("path", ""), int(req.get("max_bytes") or fileops.MAX_READ_BYTES))
            return {"content_b64": base64.b64encode(data).decode(), "size": len(data)}
        if op == "files.write":
            data = fileops._decode_content(req)
            return fileops.write(ws, req.get("path", ""), data, req.get("mode", "overwrite"))
        if op == "files.write_many":
            files = req.get("files")
            if not isinstance(files, list) or not files:
                raise RequestError("files must be a non-empty list", field="files")
            return {"files": fileops.write_many(ws, files)}
        if op == "files.list":
            return {"files": fileops.list_dir(ws, req.get("path") or ".", bool(req.get("recursive")))}
        if op == "files.glob":
            return {"paths": fileops.glob(ws, req.get("pattern", "*"), int(req.get("max_results", 1000)))}
        if op == "files.grep":
            return fileops.grep(ws, req.get("pattern", ""), req.get("path") or ".", req.get("glob"),
                                int(req.get("max_results", 100)), bool(req.get("ignore_case")))
        if op == "files.delete":
            fileops.delete(ws, req.get("path", ""))
            return {}
        raise RequestError(f"unknown operation {op!r}", field="op")

    def op_ping(self, rid: Any, req: dict[str, Any]) -> dict[str, Any]:
        return {"pong": True, "pid": os.getpid(), "contexts": sorted(self.contexts)}

    def op_context_reset(self, rid: Any, req: dict[str, Any]) -> dict[str, Any]:
        cid = str(req.get("context_id"))
        existed = cid in self.contexts
        self._drop_context(cid)
        self.reset_contexts.discard(cid)
        return {"reset": existed}


OPS = {
    "exec": Agent.op_exec,
    "ping": Agent.op_ping,
    "context.reset": Agent.op_context_reset,
    **{name: Agent.op_files for name in (
        "files.read", "files.read_bytes", "files.write", "files.write_many", "files.list",
        "files.glob", "files.grep", "files.delete")},
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="execbox-agent")
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--preload", default="auto", help="'auto', 'none' or comma-separated modules")
    parser.add_argument("--limits", default="{}", help="JSON rlimits applied to every child")
    parser.add_argument("--run-as", default="", help="UID:GID for user code when started as root")
    ns = parser.parse_args(argv)
    privsep.enter_agent(privsep.parse_run_as(ns.run_as))
    if ns.preload == "auto":
        preload = list(AUTO_PRELOAD)
    elif ns.preload in ("", "none"):
        preload = []
    else:
        preload = [p for p in ns.preload.split(",") if p]
    agent = Agent(ns.workspace, preload, json.loads(ns.limits))
    try:
        agent.serve()
    except (BrokenPipeError, EOFError):
        agent.shutdown()


if __name__ == "__main__":
    main()
