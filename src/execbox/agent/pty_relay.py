"""A background process on a pseudo-terminal: the relay child between the agent and the shell.

The agent never reads process output itself (background output goes to files), so a PTY gets a
small relay: a forked child (already the sandbox user) that opens the pty pair, forks the
command on the slave side as a session leader with it as controlling terminal, then copies
master -> the output file, the stdin pipe -> master, and applies window sizes sent on a control
pipe ("COLS ROWS\\n"). It exits with the command's status. Stdlib only.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import termios

from .fileops import write_all

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any


EXIT_POLL = 0.2
"""Seconds of a quiet pty after which the relay looks whether the command has exited."""


def set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", max(1, rows), max(1, cols), 0, 0))


def relay_main(argv: list[str], env: dict[str, str], cwd: str, size: dict[str, Any], out_fd: int,
               in_r: int, ctl_r: int, limits: Any) -> None:
    """Body of the relay child (never returns)."""
    master, slave = os.openpty()
    set_size(slave, int(size.get("cols") or 80), int(size.get("rows") or 24))
    pid = os.fork()
    if pid == 0:  # the command
        try:
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
            for fd in (0, 1, 2):
                os.dup2(slave, fd)
            for fd in (master, slave, out_fd, in_r, ctl_r):
                if fd > 2:
                    os.close(fd)
            os.chdir(cwd)
            limits()
            os.execve(argv[0], argv, env)
        except BaseException:  # noqa: BLE001
            os._exit(127)
    os.close(slave)
    os.set_blocking(master, False)
    watched = [master, in_r, ctl_r]
    pending = b""  # stdin waiting for room in the pty
    ctl_buf = b""
    status: int | None = None
    while master in watched:
        wlist = [master] if pending else []
        try:
            readable, writable, _ = select.select(watched, wlist, [], EXIT_POLL)
        except InterruptedError:
            continue
        if not readable and not writable:
            # Linux ends the loop with EIO on the master once the command (and whatever kept its
            # terminal) is gone; gVisor never does: so a command that exited ends it too, once
            # the master has nothing more to read
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                break
        if master in writable and pending:
            try:
                pending = pending[os.write(master, pending):]
            except BlockingIOError:
                pass
            except OSError:
                pending = b""
        for fd in readable:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            except OSError:  # EIO on the master: the slave side is gone
                data = b""
            if fd == master:
                if not data:
                    watched.remove(master)
                    break
                write_all(out_fd, data)
            elif fd == in_r:
                if not data:
                    watched.remove(in_r)  # stdin closed: send EOF (^D) like a terminal would
                    pending += b"\x04"
                else:
                    pending += data
            else:
                if not data:
                    watched.remove(ctl_r)
                    continue
                ctl_buf += data
                while b"\n" in ctl_buf:
                    line, ctl_buf = ctl_buf.split(b"\n", 1)
                    try:
                        cols, rows = (int(x) for x in line.split())
                        set_size(master, cols, rows)
                    except (ValueError, OSError):
                        pass
    if status is None:
        _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
