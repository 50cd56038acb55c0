"""A background process's record in the agent (``background.py``), and what ``proc.list`` says of it.

The agent is the one place that knows a box's background processes for as long as the box lives;
a host that starts later (a restarted service re-attached to a Docker container, another replica
that took the session over) learns them from ``proc.list``. So each entry says what a new host
needs to follow the process as if it had started it: whether its stdin takes input now, the first
byte of each stream still held (what lies before it was read by an earlier host and freed:
``Background._free_read``), and the ``meta`` object the host passed to ``proc.start``, kept
verbatim (at most ``META_MAX`` bytes as UTF-8 JSON; the agent never looks inside it). Stdlib only.
"""

from __future__ import annotations

from . import bg_output
from .lean import dumps

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any

META_MAX = 32 * 1024
"""Bytes (UTF-8 JSON) of the opaque ``meta`` object ``proc.start`` keeps for ``proc.list``: room
for what the service puts there, a cwd of 4096 characters of any script included (<= 16 KiB)."""


class BgProc:
    # A plain class, not a dataclass: the agent's imports are on every box's start-up path.
    __slots__ = ("pid", "command", "out_path", "err_path", "stdin_w", "started", "status", "ctl_w", "paused",
                 "discard", "punched", "relay", "relay_ctl", "seg", "report_r", "final", "ended_at", "meta")

    def __init__(self, pid: int, command: str, out_path: str, err_path: str, stdin_w: int | None,
                 started: float, ctl_w: int | None = None, relay: int | None = None,
                 relay_ctl: int | None = None, report_r: int | None = None,
                 meta: dict[str, Any] | None = None) -> None:
        self.pid, self.command, self.out_path, self.err_path = pid, command, out_path, err_path  # path prefixes
        self.stdin_w, self.started, self.ctl_w = stdin_w, started, ctl_w
        self.relay, self.relay_ctl = relay, relay_ctl  # the output relay (None: a PTY relay writes the output)
        self.report_r = report_r  # the relay's report of the bytes it wrote, read once it is reaped
        self.final: tuple[int, int] | None = None  # the streams' final sizes, once the writer is gone
        self.ended_at = 0.0  # time.monotonic() of the reap of the process
        self.seg = bg_output.SEGMENT if relay is not None else 0  # 0: one file, never rotated
        self.status: int | None = None  # wait status once reaped
        self.paused = False  # stopped by us until the host reads its backlog
        self.discard = False  # killed by the host: its exit is reported without draining the output
        self.punched = (0, 0)  # bytes of stdout/stderr already freed: each stream is held from there on
        self.meta = meta  # the host's own description (proc.start ``meta``), returned by proc.list as given


def check_meta(value: Any, error: Any) -> dict[str, Any] | None:
    """``proc.start``'s ``meta``: None or an object of at most ``META_MAX`` bytes as JSON; else
    ``error(message, field=...)`` is raised."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise error("meta must be an object", field="meta")
    if len(dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")) > META_MAX:
        raise error(f"meta is over {META_MAX} bytes as JSON", field="meta")
    return value


def describe(proc: BgProc) -> dict[str, Any]:
    """One ``proc.list`` entry. ``running`` is false once the process was reaped (its exit and the
    rest of its output wait for ``proc.poll``); ``stdout_from``/``stderr_from``: the first offset of
    each stream a poll still returns (the bytes before it are gone)."""
    entry: dict[str, Any] = {"pid": proc.pid, "command": proc.command, "started": proc.started,
                             "running": proc.status is None, "stdin": proc.stdin_w is not None,
                             "pty": proc.ctl_w is not None, "stdout_from": proc.punched[0],
                             "stderr_from": proc.punched[1]}
    if proc.meta is not None:
        entry["meta"] = proc.meta
    return entry
