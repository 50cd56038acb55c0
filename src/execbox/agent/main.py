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
import sys
import tempfile
import time
import traceback
from typing import Any

from . import background, contexts, executor, fileops, fsextra, js_contexts, privsep, procs, protocol
from .children import ALIASES, LANGS, Children, RequestError, Spare  # noqa: F401 - re-exported

AGENT_VERSION = "1"
AUTO_PRELOAD = ("numpy", "pandas", "matplotlib.pyplot")


class Agent(Children):
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
        self.js_contexts: dict[str, js_contexts.JsContext] = {}
        self.reset_contexts: set[str] = set()
        self.frames = protocol.FrameBuffer()
        self.pending: collections.deque[dict[str, Any]] = collections.deque()
        self.subreaper = procs.become_subreaper()
        procs.set_dumpable(False)  # user code (same uid) must not reach our fds through /proc
        self.preloaded = self._preload(preload)
        self.seq = 0
        self.spare: Spare | None = None
        self.bg = background.Background(self)
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
        except (RequestError, fileops.FileOpError, background.BackgroundError) as e:
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
        for js in list(self.js_contexts.values()):
            executor.kill_quietly(js.pid)
        procs.kill_tree(os.getpid(), include_root=False)
        shutil.rmtree(self.tmp, ignore_errors=True)
        shutil.rmtree(self.bg.dir, ignore_errors=True)

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
        return {"pong": True, "pid": os.getpid(), "contexts": sorted({*self.contexts, *self.js_contexts})}

    def op_context_reset(self, rid: Any, req: dict[str, Any]) -> dict[str, Any]:
        cid = str(req.get("context_id"))
        existed = cid in self.contexts or cid in self.js_contexts
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
    **{name: (lambda agent, rid, req: fsextra.handle(agent.ws, req)) for name in fsextra.OPS},
    **{name: (lambda agent, rid, req, fn=fn: fn(agent.bg, req)) for name, fn in background.OPS.items()},
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
