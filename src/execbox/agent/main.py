"""The agent's zygote loop: pre-import, then serve framed requests, forking per execution.

Started by every self-hosted backend as the box's main process with the protocol on stdin and
stdout. It moves the protocol to private fds and points 0/1 at /dev/null, so nothing the user's
code prints can corrupt the stream, and children close those fds before running user code.
"""

from __future__ import annotations

import gc
import os
import select
import sys
import time

from . import background, contexts, fileops, fsextra, js_contexts, pidns, privsep, procs, protocol, pump, runners
from .children import ALIASES, LANGS, Children, RequestError  # noqa: F401 - re-exported
from .lean import b64encode, loads, signal
from .spares import Spare

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any

AGENT_VERSION = "1"
AUTO_PRELOAD = ("numpy", "pandas", "matplotlib.pyplot")
SPARE_GRACE = 0.005
"""Seconds the agent waits for another request after a box's first run before forking a spare."""
USER_IMPORTS = ("re", "json", "base64", "signal", "linecache", "traceback")
"""What user code commonly needs and the agent itself does without (lean.py). A box that serves many
runs imports them at start, so that each run's fork inherits them; a one-shot's box (``--oneshot``),
destroyed after its single run, starts without them and that run imports what it uses."""


class Agent(Children):
    def __init__(self, workspace: str, preload: list[str], limits: dict[str, Any], oneshot: bool = False) -> None:
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
        if os.path.lexists(os.path.join(self.ws, ".execbox-journal")):  # a write a killed agent left
            from . import write_journal  # noqa: PLC0415 - only then: off the box's start-up path

            write_journal.recover(self.ws)
        self.tmp = _private_tmpdir()
        self.limits = limits
        self.node = _which("node") or _which("nodejs")
        self.bash = _which("bash") or "/bin/bash"
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_w)
        self.detached: set[int] = set()  # finished runs answered before their reap (Children.finished)
        signal.signal(signal.SIGCHLD, self._on_sigchld)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.exited: dict[int, tuple[int, Any]] = {}
        self.contexts: dict[str, contexts.Context] = {}
        self.js_contexts: dict[str, js_contexts.JsContext] = {}
        self.sh_contexts: dict[str, js_contexts.JsContext] = {}  # bash (bash_contexts.py)
        self.reset_contexts: set[tuple[int, str]] = set()  # (id of its language's table, context_id)
        self.frames = protocol.FrameBuffer()
        self.pending: list[dict[str, Any]] = []  # a frame or two: no deque (collections costs ~1 ms a start)
        self.subreaper = procs.become_subreaper()
        procs.set_dumpable(False)  # user code (same uid) must not reach our fds through /proc
        runners.seed_matplotlib_cache()
        self.preloaded = self._preload(preload)
        if not oneshot:
            for name in USER_IMPORTS:
                try:
                    __import__(name)
                except ImportError:  # a trimmed runtime: its runs import what they need themselves
                    pass
        self.seq = 0
        self.spare: Spare | None = None
        self.figures_preloaded = not oneshot and "matplotlib.pyplot" in sys.modules
        self.draws_figures = False  # a run drew a figure: spares warm their own (warm_spare_when_idle)
        self.fork_cost: float | None = None  # seconds a spare's fork blocks the agent (moving average)
        self.bg = background.Background(self)
        # Everything imported so far is shared with every fork: keep the collector from touching
        # (and so copying) those pages in each child. A one-shot forks once: the full collection
        # (~2 ms) would cost more than the pages it saves copying.
        if not oneshot:
            gc.collect()
        gc.freeze()

    # -- start-up ---------------------------------------------------------------------------
    @staticmethod
    def _preload(names: list[str]) -> list[str]:
        if not names:
            return []
        import importlib.util  # only when preloading: ~1.5 ms a box start otherwise

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
        try:
            runners.warm_figures()
        except Exception:  # noqa: BLE001 - only a warm-up: the user's own plot reports any real error
            pass
        return done

    def languages(self) -> list[str]:
        return [lang for lang in LANGS if lang != "javascript" or self.node]

    # -- protocol ---------------------------------------------------------------------------
    def send(self, message: dict[str, Any]) -> None:
        protocol.write_frame(self.proto_out, message)

    def next_request(self) -> dict[str, Any] | None:
        """The next request to serve: ops served beside runs (``protocol.BESIDE_RUN``) first.

        One read may bring an ``exec`` and, right behind it, another thread's ``proc.poll`` or
        file write; served in order, it would wait in ``pending`` for the whole run (the run's pump
        only sees bytes read after it starts). The host sends these ops without waiting for a reply
        to an ordinary request, so serving them first reorders nothing it relies on.
        A ``cancel`` is only meaningful during its run (see ``op_exec``): a late one is dropped.
        """
        while True:
            for i, msg in enumerate(self.pending):
                if msg.get("op") in protocol.BESIDE_RUN:
                    return self.pending.pop(i)
            while self.pending:
                msg = self.pending.pop(0)
                if msg.get("op") != "cancel":
                    return msg
            data = os.read(self.proto_in, 1 << 20)
            if not data:
                return None
            self.pending.extend(self.frames.feed(data))

    def serve(self) -> None:
        self.send({
            "event": "ready", "version": AGENT_VERSION, "protocol": protocol.PROTOCOL_VERSION,
            "pid": os.getpid(), "uid": os.getuid(), "python": sys.version.split()[0],
            "languages": self.languages(), "preloaded": self.preloaded, "workspace": self.ws,
            "subreaper": self.subreaper, "privsep": privsep.mode(),
            "pid_ns": pidns.enabled(), "beside_run": sorted(protocol.FILE_OPS),
            "startup_ms": round((time.monotonic() - self.t0) * 1000, 1),
        })
        self.make_spare()
        while True:
            req = self.next_request()
            if req is None:
                break
            if not self.handle(req):
                break
            if not self.pending and not (self.seq == 1 and self.spare is None and self._request_within(SPARE_GRACE)):
                self.make_spare()
            self.warm_spare_when_idle()
        self.shutdown()

    def _request_within(self, seconds: float) -> bool:
        """Whether the host sends something within ``seconds`` (after a box's first run).

        A box's first run is often its only one: a one-shot is destroyed right after the reply,
        and a spare forked meanwhile is wasted work on a loaded host. Waiting a moment first
        keeps that fork off one-shots; a session's next request then forks its child itself.
        """
        return bool(select.select([self.proto_in], [], [], seconds)[0])

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
        except (RequestError, fileops.FileOpError, background.BackgroundError, procs.NoRoomForProcess) as e:
            self.send({"id": rid, "ok": False, "error": {
                "code": e.code, "status": e.status, "message": str(e), "details": e.details}})
        except Exception as e:  # noqa: BLE001 - report, keep serving
            import traceback  # an agent bug's path only: not imported on every box start

            self.send({"id": rid, "ok": False, "error": {
                "code": "SB009", "status": 503, "message": f"agent error: {type(e).__name__}: {e}",
                "details": {"traceback": traceback.format_exc(limit=5)}}})
        return True

    def _on_sigchld(self, *_: Any) -> None:
        self.reap_detached()

    def reap_detached(self) -> None:
        """Reap runs that were answered before they exited (``detached``) as soon as they exit,
        so no zombie outlives its run while the agent waits for the next request."""
        for pid in tuple(self.detached):
            try:
                got, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                got = pid  # reaped by on_wake already
            if got:
                self.detached.discard(pid)

    def on_wake(self) -> None:
        for pid, status, ru in procs.reap_all():
            if pid in self.detached:  # its run already answered from its exit record
                self.detached.discard(pid)
                continue
            self.exited[pid] = (status, ru)

    def shutdown(self) -> None:
        self._discard_spare()
        for ctx in list(self.contexts.values()):
            pump.kill_quietly(ctx.pid)
        for js in self._pipe_contexts():
            pump.kill_quietly(js.pid)
        procs.kill_tree(os.getpid(), include_root=False)
        fileops.remove_tree(self.tmp)  # background output files included

    # -- files ------------------------------------------------------------------------------
    def op_files(self, rid: Any, req: dict[str, Any]) -> Any:
        from . import search, writes  # noqa: PLC0415 - first file op only, off the box's start-up path

        op = req["op"]
        ws = self.ws
        path = req.get("path", "")
        if op == "files.read":
            return fileops.read_text(ws, path, _int_arg(req, "offset", 0), _int_arg(req, "limit", 2000))
        if op == "files.read_bytes":
            offset, length = req.get("offset"), req.get("length")
            data, size = fileops.read_range(
                ws, path, None if offset is None else _int_arg(req, "offset", 0),
                None if length is None else _int_arg(req, "length", 0),
                _int_arg(req, "max_bytes", 0) or fileops.MAX_READ_BYTES,
                hint="; read it in pieces (offset and length)")
            return {"content_b64": b64encode(data).decode(), "size": len(data), "offset": offset or 0,
                    "total_size": size}
        if op == "files.write":
            mode = req.get("mode", "overwrite")
            if not isinstance(mode, str):
                raise RequestError("mode must be a string: overwrite, append or create", field="mode")
            return writes.write(ws, path, writes.decode_content(req), mode)
        if op == "files.write_many":
            files = req.get("files")
            if not isinstance(files, list) or not files:
                raise RequestError("files must be a non-empty list", field="files")
            return {"files": writes.write_many(ws, files)}
        if op == "files.list":
            return fileops.list_dir(ws, path or ".", bool(req.get("recursive")))
        if op == "files.glob":
            return search.glob(ws, req.get("pattern", "*"), _int_arg(req, "max_results", 1000),
                               search.time_limit(req.get("timeout")))
        if op == "files.grep":
            glob = req.get("glob")
            if glob is not None and not isinstance(glob, str):
                raise RequestError("glob must be a string", field="glob")
            return search.grep(ws, req.get("pattern", ""), path or ".", glob or None,
                               _int_arg(req, "max_results", 100), bool(req.get("ignore_case")),
                               search.time_limit(req.get("timeout")))
        if op == "files.delete":
            fileops.delete(ws, path)
            return {}
        raise RequestError(f"unknown operation {op!r}", field="op")

    def op_ping(self, rid: Any, req: dict[str, Any]) -> dict[str, Any]:
        return {"pong": True, "pid": os.getpid(),
                "contexts": sorted({*self.contexts, *self.js_contexts, *self.sh_contexts}),
                "spare_figures": self.spare_figures(), "beside_run": sorted(protocol.FILE_OPS)}

    def op_context_reset(self, rid: Any, req: dict[str, Any]) -> dict[str, Any]:
        cid = str(req.get("context_id"))
        existed = cid in self.contexts or cid in self.js_contexts or cid in self.sh_contexts
        self._drop_context(cid)
        for table in (self.contexts, self.js_contexts, self.sh_contexts):
            self.reset_contexts.discard((id(table), cid))
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


def _int_arg(req: dict[str, Any], name: str, default: int) -> int:
    """An integer request field (a whole float such as 10.0 too), or a request error naming it."""
    value = req.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} must be an integer", field=name)
    return value


# -- start-up helpers: stdlib-light on purpose (every import here is paid on every box start) --
OPTIONS = {
    "--workspace": "directory the box's code works in (required)",
    "--preload": "'auto', 'none' or comma-separated modules (default auto)",
    "--limits": "JSON rlimits applied to every child (default {})",
    "--run-as": "UID:GID for user code when started as root",
}
FLAGS = {
    "--pid-ns": "user code in a PID namespace of its own (needs --run-as and CAP_SYS_ADMIN; runsc boxes)",
    "--oneshot": "the box serves a single run: skip importing what only later runs would share",
}
USAGE = ("usage: execbox-agent --workspace DIR [--preload P] [--limits JSON] [--run-as UID:GID] [--pid-ns]"
         " [--oneshot]")


def parse_args(argv: list[str]) -> dict[str, str]:
    """The agent's fixed options (``--name value`` or ``--name=value``); exit 2 on anything else.

    Not argparse: importing it (with gettext and textwrap) costs more than the agent's own code,
    and the argv always comes from execbox's own backends.
    """
    out = {"--preload": "auto", "--limits": "{}", "--run-as": ""}
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name in ("-h", "--help"):
            print(USAGE + "".join(f"\n  {k:12} {v}" for k, v in {**OPTIONS, **FLAGS}.items()), file=sys.stderr)
            raise SystemExit(0)
        if name in FLAGS and not eq:
            out[name] = "1"
            i += 1
            continue
        if name not in OPTIONS:
            raise SystemExit(f"{USAGE}\nexecbox-agent: unknown argument {argv[i]!r}")
        if not eq:
            i += 1
            if i >= len(argv):
                raise SystemExit(f"{USAGE}\nexecbox-agent: {name} needs a value")
            value = argv[i]
        out[name] = value
        i += 1
    if "--workspace" not in out:
        raise SystemExit(f"{USAGE}\nexecbox-agent: --workspace is required")
    return out


def _which(name: str) -> str | None:
    """``shutil.which`` without importing shutil (and with it bz2, lzma, fnmatch)."""
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(d or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _private_tmpdir() -> str:
    """A fresh 0700 directory under $TMPDIR, like ``tempfile.mkdtemp`` (which imports random,
    shutil and weakref)."""
    base = os.environ.get("TMPDIR") or "/tmp"
    for _ in range(100):
        path = os.path.join(base, f"execbox-agent-{os.urandom(6).hex()}")
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free agent temp directory under {base}")


def preload_names(choice: str) -> list[str]:
    """``--preload``: 'none', 'auto', or modules separated by commas, where 'auto' stands for
    AUTO_PRELOAD (so 'auto,torch' is the usual set plus torch, for GPU boxes)."""
    names = [p.strip() for p in choice.split(",") if p.strip() not in ("", "none")]
    return [m for p in names for m in (AUTO_PRELOAD if p == "auto" else (p,))]


def main(argv: list[str] | None = None) -> None:
    opts = parse_args(sys.argv[1:] if argv is None else list(argv))
    privsep.enter_agent(privsep.parse_run_as(opts["--run-as"]))
    if "--pid-ns" in opts and privsep.active() is not None:  # the namespace needs root at start
        pidns.setup()
    agent = Agent(opts["--workspace"], preload_names(opts["--preload"]), loads(opts["--limits"]),
                  oneshot="--oneshot" in opts)
    try:
        agent.serve()
    except (BrokenPipeError, EOFError):
        agent.shutdown()


if __name__ == "__main__":
    main()
