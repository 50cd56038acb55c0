"""Background processes: tracked children that run while the agent serves other requests.

``exec`` holds the agent until the run ends; a background process (envd's process.Start, the
E2B SDK's ``commands.run(background=True)``) must not. ``proc.start`` forks a child running
``bash -c CMD`` and answers at once with its pid. Its stdout/stderr are pipes drained by a relay
child into segment files in the agent's temp directory (``bg_output``: no pipe the single-threaded agent
would have to drain while it is busy, and no file of the process's own that the box's file-size
limit would end after 512 MiB of output in total), its stdin is a pipe the agent keeps the write
end of. The host then polls (``proc.poll``: new output from an
offset, and the exit once all output was read), writes stdin (``proc.input``, ``proc.close_stdin``),
signals (``proc.signal``) and lists (``proc.list``: also for a host that did not start them, see
``bg_record``). These ops are answered even while an ``exec``
runs (see ``protocol.INLINE_OPS``). Background children are kept out of the one-shot runs'
clean-up (``Children._keep_pids``) and die with the box like every other child.
"""

from __future__ import annotations

import os
import time

from . import bg_output, privsep, procs
from .bg_record import BgProc, check_meta, describe
from .lean import b64decode, b64encode, signal

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any

MAX_PROCESSES = 64
POLL_CHUNK = 256 * 1024  # bytes of each stream one poll returns at most
BACKLOG_STOP = 8 * 1024 * 1024  # unread output at which the job is paused (SIGSTOP) ...
BACKLOG_CONT = 1024 * 1024  # ... and below which it continues: a pipe's back-pressure, on files
PUNCH_EVERY = 1024 * 1024  # free output the host has read (the files live on the box's tmpfs)
RELAY_END_WAIT = 0.2  # seconds the agent waits for a relay to drain once its process exited
RELAY_GRACE = 1.0  # a relay still there DRAIN_SECONDS + this after its process's end is killed
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT,
           "SIGHUP": signal.SIGHUP, "SIGQUIT": signal.SIGQUIT, "SIGUSR1": signal.SIGUSR1,
           "SIGUSR2": signal.SIGUSR2}


class BackgroundError(Exception):
    def __init__(self, message: str, status: int = 400, code: str = "SB002", **details: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.details = status, code, details


class Background:
    """The agent's table of background processes (one per box)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.procs: dict[int, BgProc] = {}
        self._dir: str | None = None
        self._stray: set[int] = set()  # relays of forgotten processes, not reaped yet

    @property
    def dir(self) -> str:
        """Output files: inside the agent's own 0700 temp dir (made on first use, gone at shutdown)."""
        if self._dir is None:
            path = os.path.join(self.agent.tmp, "background")
            os.makedirs(path, mode=0o700, exist_ok=True)
            self._dir = path
        return self._dir

    def pids(self) -> set[int]:
        """Background processes and their output relays (they outlive runs)."""
        return set(self.procs) | {p.relay for p in self.procs.values() if p.relay is not None} | self._stray

    def parent_fds(self) -> list[int]:
        """The agent's ends of background stdin, PTY control and relay control pipes (a forked
        child closes them)."""
        return [fd for p in self.procs.values() for fd in (p.stdin_w, p.ctl_w, p.relay_ctl, p.report_r)
                if fd is not None]

    # -- requests ---------------------------------------------------------------------------
    def start(self, req: dict[str, Any]) -> dict[str, Any]:
        agent = self.agent
        command = req.get("command")
        if not isinstance(command, str) or not command.strip() or "\x00" in command:
            raise BackgroundError("command must be a non-empty string", field="command")
        env_in, cwd = procs.request_env_and_cwd(agent.ws, req, BackgroundError)
        self.reap()
        if len(self.procs) >= MAX_PROCESSES:
            raise BackgroundError(f"too many background processes (max {MAX_PROCESSES})", status=429,
                                  code="SB008", field="command")
        pty = req.get("pty")
        if pty is not None and not isinstance(pty, dict):
            raise BackgroundError("pty must be an object {cols, rows}", field="pty")
        meta = check_meta(req.get("meta"), BackgroundError)
        env = dict(os.environ)
        env.update(env_in)
        stamp = f"{time.monotonic_ns()}"
        out_path = os.path.join(self.dir, f"{stamp}.out")
        err_path = os.path.join(self.dir, f"{stamp}.err")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        out_fd = os.open(bg_output.segment_path(out_path, 0), flags, 0o600)
        err_fd = os.open(bg_output.segment_path(err_path, 0), flags, 0o600)
        relay = relay_ctl = report_r = None
        if pty is None:  # stdout/stderr: pipes to a relay that writes the files (bg_output)
            os.close(out_fd)
            os.close(err_fd)
            try:
                relay, relay_ctl, report_r, out_fd, err_fd = self._start_relay(out_path, err_path)
            except procs.NoRoomForProcess:
                for path in (out_path, err_path):
                    bg_output.remove(path)
                raise
        want_stdin = bool(req.get("stdin")) or pty is not None
        in_r, in_w = os.pipe() if want_stdin else (os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), None)
        ctl_r, ctl_w = os.pipe() if pty is not None else (-1, None)
        argv = [agent.bash, "--noprofile", "--norc", "-c", command]
        sync_r, sync_w = os.pipe()  # both CLOEXEC: EOF on sync_r once the child exec'd bash
        try:
            pid = procs.fork("the background process", tuple(fd for fd in (out_fd, err_fd, in_r, sync_r, sync_w, ctl_r)
                                                              if fd >= 0))
        except procs.NoRoomForProcess:  # its relay and files go too
            self._forget(BgProc(-1, command, out_path, err_path, in_w, time.time(), ctl_w=ctl_w, relay=relay,
                                relay_ctl=relay_ctl, report_r=report_r))
            raise
        if pid == 0:  # the child: becomes `bash -c CMD` with the sandbox user's rights
            try:
                agent.child_prepare()
                for sig in privsep.IGNORED_SIGNALS:
                    signal.signal(sig, signal.SIG_DFL)
                if pty is not None:
                    from . import pty_relay  # noqa: PLC0415 - terminals only: off the start-up path

                    os.close(sync_w)  # the relay is running: start() may answer
                    pty_relay.relay_main(argv, env, cwd, pty, out_fd, in_r, ctl_r,
                                         lambda: procs.apply_rlimits(agent.limits))
                os.dup2(in_r, 0)
                os.dup2(out_fd, 1)
                os.dup2(err_fd, 2)
                os.chdir(cwd)
                procs.apply_rlimits(agent.limits)
                os.execve(agent.bash, argv, env)
            except BaseException as e:  # noqa: BLE001
                try:
                    os.write(sync_w, f"{type(e).__name__}: {e}".encode()[:500])
                finally:
                    os._exit(127)
        agent.exited.pop(pid, None)  # a reused pid's old status is not this child's
        for fd in (out_fd, err_fd, in_r, sync_w, ctl_r):
            if fd >= 0:
                os.close(fd)
        # Wait for the exec: until then the child has the agent's signal dispositions, and a
        # signal sent right after this reply would be lost.
        failure = b""
        while chunk := os.read(sync_r, 512):
            failure += chunk
        os.close(sync_r)
        proc = BgProc(pid, command, out_path, err_path, in_w, time.time(), ctl_w=ctl_w, relay=relay,
                      relay_ctl=relay_ctl, report_r=report_r, meta=meta)
        if failure:
            self._stray.add(pid)  # its exit status is of no use: popped once reaped
            self._forget(proc)
            raise BackgroundError(f"could not start the process: {failure.decode(errors='replace')}",
                                  status=503, code="SB009")
        if in_w is not None:
            os.set_blocking(in_w, False)
        self.procs[pid] = proc
        return {"pid": pid}

    def _start_relay(self, out_path: str, err_path: str) -> tuple[int, int, int, int, int]:
        """Fork the output relay: (its pid, the agent's end of its control pipe, the read end of
        its report pipe, the write ends of the stdout and stderr pipes for the process)."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ctl_r, ctl_w = os.pipe()
        report_r, report_w = os.pipe()
        relay = procs.fork("the background process's output relay",
                           (out_r, out_w, err_r, err_w, ctl_r, ctl_w, report_r, report_w))
        if relay == 0:
            try:
                self.agent.child_prepare()
                procs.set_dumpable(False)  # user code (same uid) must not reach its pipes through /proc
                procs.close_fds_except((out_r, err_r, ctl_r, report_w))
                bg_output.relay_main({out_r: out_path, err_r: err_path}, ctl_r, report_w)
            finally:
                os._exit(0)
        self.agent.exited.pop(relay, None)
        for fd in (out_r, err_r, ctl_r, report_w):
            os.close(fd)
        return relay, ctl_w, report_r, out_w, err_w

    def _get(self, req: dict[str, Any]) -> BgProc:
        pid = req.get("pid")
        proc = self.procs.get(pid) if isinstance(pid, int) else None
        if proc is None:
            raise BackgroundError(f"no background process {pid!r}", status=404, field="pid")
        return proc

    def poll(self, req: dict[str, Any]) -> dict[str, Any]:
        """Output past the given offsets; ``exited`` only once all output has been returned, ``ended``
        (with the streams' final sizes) once the process and its relay are gone."""
        proc = self._get(req)
        self.reap()
        # read the exit first (the process's and its relay's): output written before it is in the files
        drained = proc.status is not None and proc.relay is None
        out_off, err_off = max(0, int(req.get("stdout_offset") or 0)), max(0, int(req.get("stderr_offset") or 0))
        self._free_read(proc, out_off, err_off)
        out_final, err_final = proc.final if drained and proc.final is not None else (None, None)
        out, out_more, out_size = bg_output.read_from(proc.out_path, out_off, POLL_CHUNK, proc.seg, out_final)
        err, err_more, err_size = bg_output.read_from(proc.err_path, err_off, POLL_CHUNK, proc.seg, err_final)
        self._pace(proc, max(out_size - out_off - len(out), err_size - err_off - len(err)))
        # ended: the process and its relay are gone, so the sizes are final (the host may then skip
        # to the tail of output it will not wait for a client to read)
        value: dict[str, Any] = {"stdout_b64": b64encode(out).decode(), "stderr_b64": b64encode(err).decode(),
                                 "exited": False, "ended": drained, "stdout_size": out_size, "stderr_size": err_size}
        if proc.status is not None and (proc.discard or (drained and not out_more and not err_more)):
            assert proc.status is not None
            code, sig = procs.decode_status(proc.status)
            value.update(exited=True, exit_code=code, signal=sig)
            self._forget(proc)
        return value

    def _free_read(self, proc: BgProc, out_off: int, err_off: int) -> None:
        """Free what the host has already read (whole segments, then punched pages): offsets stay
        valid, the tmpfs pages go."""
        done_out, done_err = proc.punched
        if out_off - done_out >= PUNCH_EVERY:
            done_out = bg_output.free_read(proc.out_path, done_out, out_off, proc.seg)
        if err_off - done_err >= PUNCH_EVERY:
            done_err = bg_output.free_read(proc.err_path, done_err, err_off, proc.seg)
        proc.punched = (done_out, done_err)

    def _pace(self, proc: BgProc, backlog: int) -> None:
        if proc.status is not None:
            return
        if not proc.paused and backlog > BACKLOG_STOP:
            proc.paused = _killpg(proc.pid, signal.SIGSTOP)
        elif proc.paused and backlog < BACKLOG_CONT:
            proc.paused = not _killpg(proc.pid, signal.SIGCONT)

    def write_input(self, req: dict[str, Any]) -> dict[str, Any]:
        proc = self._get(req)
        if proc.stdin_w is None:
            raise BackgroundError(f"process {proc.pid} has no stdin (start it with stdin enabled)",
                                  status=409, field="pid")
        try:
            data = b64decode(str(req.get("data_b64") or ""))
        except ValueError:
            raise BackgroundError("data_b64 must be base64", field="data_b64") from None
        view = memoryview(data)
        deadline = time.monotonic() + 2.0
        while view:
            try:
                view = view[os.write(proc.stdin_w, view):]
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BackgroundError(f"stdin of process {proc.pid} is full (it does not read)",
                                          status=429, code="SB008", written=len(data) - len(view)) from None
                time.sleep(0.005)
            except BrokenPipeError:
                raise BackgroundError(f"process {proc.pid} closed its stdin", status=409) from None
        return {"written": len(data)}

    def close_input(self, req: dict[str, Any]) -> dict[str, Any]:
        proc = self._get(req)
        if proc.stdin_w is not None:
            os.close(proc.stdin_w)
            proc.stdin_w = None
        return {}

    def resize(self, req: dict[str, Any]) -> dict[str, Any]:
        proc = self._get(req)
        if proc.ctl_w is None:
            raise BackgroundError(f"process {proc.pid} has no terminal", status=409, field="pid")
        cols, rows = req.get("cols"), req.get("rows")
        if not all(isinstance(v, int) and 0 < v < 10000 for v in (cols, rows)):
            raise BackgroundError("cols and rows must be positive integers", field="cols")
        os.write(proc.ctl_w, f"{cols} {rows}\n".encode())
        return {}

    def send_signal(self, req: dict[str, Any]) -> dict[str, Any]:
        proc = self._get(req)
        name = str(req.get("signal") or "SIGKILL").upper()
        sig = SIGNALS.get(name)
        if sig is None:
            raise BackgroundError(f"unsupported signal {name!r}", field="signal", allowed=sorted(SIGNALS))
        if sig == signal.SIGKILL:
            proc.discard = True  # whatever it still had buffered is not worth waiting for
            relay = proc.relay
            if relay is not None:  # it ends with what was read (a stopped relay must not hold it)
                _kill(relay)
            if proc.status is not None:
                return {"signalled": relay is not None}
            procs.kill_tree(proc.pid, keep=self.agent._keep_pids() - {proc.pid})
            return {"signalled": True}
        if proc.status is not None:
            return {"signalled": False}
        ok = _killpg(proc.pid, sig)  # the child called setsid: its group is its whole job
        if ok and proc.paused:  # a paused job must see the signal now
            proc.paused = not _killpg(proc.pid, signal.SIGCONT)
        return {"signalled": ok}

    def list(self, req: dict[str, Any]) -> dict[str, Any]:
        """Every process not yet polled to its end, with what a host that did not start it needs
        to follow it (``bg_record.describe``)."""
        self.reap()
        return {"processes": [describe(p) for p in self.procs.values()]}

    # -- bookkeeping ------------------------------------------------------------------------
    def reap(self) -> None:
        """Move exit statuses of our children from the agent's reaped table onto their entries."""
        self.agent.on_wake()
        exited = self.agent.exited
        for pid in [p for p in self._stray if p in exited]:
            exited.pop(pid)
            self._stray.discard(pid)
        now = time.monotonic()
        for proc in self.procs.values():
            if proc.status is None and proc.pid in exited:
                proc.status, _ = exited.pop(proc.pid)
                proc.ended_at = now
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # what it left running in its group ends too
                except OSError:
                    pass
                self._end_relay(proc)
            if proc.relay is not None and proc.relay in exited:
                exited.pop(proc.relay)
                self._relay_gone(proc)
            if (proc.relay is not None and proc.status is not None
                    and now - proc.ended_at > bg_output.DRAIN_SECONDS + RELAY_GRACE):
                _kill(proc.relay)  # it drains no more (stopped by user code?): the end is what was read
                self._end_relay(proc)
            if proc.status is not None and proc.relay is None and proc.final is None:
                self._relay_gone(proc)

    def _end_relay(self, proc: BgProc) -> None:
        """The process exited: its relay takes what the pipes hold and exits (waited for briefly)."""
        if proc.relay_ctl is not None:
            os.close(proc.relay_ctl)
            proc.relay_ctl = None
        deadline = time.monotonic() + RELAY_END_WAIT
        while proc.relay is not None and time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(proc.relay, os.WNOHANG)
            except ChildProcessError:  # reaped with the others: its status is in the agent's table
                self.agent.exited.pop(proc.relay, None)
                done = proc.relay
            if done:
                self._relay_gone(proc)
            else:
                time.sleep(0.001)

    def _relay_gone(self, proc: BgProc) -> None:
        """The writer of the output is gone: fix the streams' final sizes (the relay's own counts;
        the files' sizes now when it left none, or a PTY relay wrote them). Nothing written to the
        files later (by what user code left running) is read."""
        proc.relay = None
        final = None
        if proc.report_r is not None:
            final = bg_output.read_report(proc.report_r)
            os.close(proc.report_r)
            proc.report_r = None
        if final is None:
            final = (bg_output.stream_size(proc.out_path, proc.punched[0], proc.seg),
                     bg_output.stream_size(proc.err_path, proc.punched[1], proc.seg))
        proc.final = final

    def _forget(self, proc: BgProc) -> None:
        self.procs.pop(proc.pid, None)
        for fd in (proc.stdin_w, proc.ctl_w, proc.relay_ctl, proc.report_r):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        proc.relay_ctl = proc.report_r = None
        if proc.relay is not None:  # killed by the host (its output is not wanted), or never started
            _kill(proc.relay)
            self._stray.add(proc.relay)
            proc.relay = None
        for path in (proc.out_path, proc.err_path):
            bg_output.remove(path)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _killpg(pid: int, sig: int) -> bool:
    try:
        os.killpg(pid, sig)
        return True
    except OSError:
        return False


OPS = {
    "proc.start": Background.start,
    "proc.poll": Background.poll,
    "proc.input": Background.write_input,
    "proc.close_stdin": Background.close_input,
    "proc.signal": Background.send_signal,
    "proc.list": Background.list,
    "proc.resize": Background.resize,
}
