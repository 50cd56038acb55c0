"""The HTTP API's follower of a background process (``background.py``; the loop is ``follower.py``,
shared with the E2B facade): it polls the agent into the process's buffers, waits while a
stream holds its share or the budget is spent, and applies the tail rule at the end. It names the
process to the agent by its pid in the box (``box_pid``), never by its public id. The process's
place under its tenant's cap is the table's to free (``ProcessTable.finished``, once), so a process
the table ended as ``lost`` (its box ended under it) is not counted twice."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..errors import SandboxError
from .bg_adopt import BOX_ENDED, box_alive
from .executions import RunSpec
from .follower import QUIET_AFTER, Follower

if TYPE_CHECKING:
    from .background import BgProcess, ProcessTable


class HttpFollower(Follower):
    """Follows a ``BgProcess`` into its buffers: output waits in the box while a stream holds its
    share of unacknowledged bytes (at most ``HOLD``) or the budget is spent (a read that frees
    room wakes the follower early). A process that ended in the box while its output waits, with
    no client reading it, skips to the tail of that output, and takes no byte past the sizes the
    box reported then (an ended stream does not grow), booked on the budget like any other."""

    poll_quiet = 2.0  # a read wakes it at once, and it polls every poll_idle while a client reads

    def __init__(self, table: ProcessTable, p: BgProcess, spec: RunSpec) -> None:
        deadline = None if p.timeout is None else p.started_mono + p.timeout
        super().__init__(p.provider, p.instance_id, p.box_pid, deadline, table.runs, spec, p.started_mono)
        self.table, self.p = table, p
        self.draining = False  # skipped to the tail of an ended process: take the rest, as the budget allows
        self.ends: tuple[int, int] | None = None  # the streams' final sizes the box reported at the skip

    def offsets(self) -> tuple[int, int, bool]:
        p = self.p
        hold = self.table.stream_hold(p.tenant_id)
        with p.cond:
            # draining: the tail was sized to fit, so a stream may hold more than its share
            full = not self.draining and (len(p.out.buf) >= hold or len(p.err.buf) >= hold)
            out_end, err_end = p.out.end, p.err.end
        if not full and self.table.budget.room(p.tenant_id) <= 0:
            full = True
            self.table.relieve(p.tenant_id)
        return out_end, err_end, full

    def run(self) -> None:
        try:
            super().run()
        finally:  # a follower that failed frees its place too (a no-op after ``ended``)
            self.table.finished(self.p)

    def take(self, poll: dict[str, Any]) -> None:
        p = self.p
        p.saw_poll(poll)  # what the box says of the end, for info() while output still waits
        out, err, last = poll["stdout"], poll["stderr"], bool(poll.get("exited"))
        if last:  # it leaves its tenant's count before a reader hears of the end: a new start fits
            self.table.finished(p)
        with p.cond:
            if p.forgotten or p.ended:  # ended by the table (lost): nothing more is its output
                return
            if self.ends is not None:  # never past the sizes the box reported at its end
                out = out[:max(0, self.ends[0] - p.out.end)]
                err = err[:max(0, self.ends[1] - p.err.end)]
            if last:  # the end: its last piece (a poll's worth) taken whole, booked fit or not
                p.out.buf += out
                p.err.buf += err
            else:  # as much as the budget has room for; the rest is polled again
                p.out.buf += out[:self.table.budget.take(p.tenant_id, len(out))]
                p.err.buf += err[:self.table.budget.take(p.tenant_id, len(err))]
                p.charged = p.held  # booked by budget.take
            p.settle()
            if last:
                p.exit_code, p.signal = poll.get("exit_code"), poll.get("signal")
                p.ended, p.ended_at = True, time.time()
            if out or err or p.ended:
                p.changed()
            if last and not p.reader_active(time.monotonic()):
                p.keep_tail(self.table.tail)

    def skip(self, poll: dict[str, Any]) -> bool:
        """Ended in the box while output waits: with no reader, go on from the streams' tails."""
        p = self.p
        p.saw_poll(poll)
        with p.cond:
            if p.reader_active(time.monotonic()) or "stdout_size" not in poll:
                return False
            tail = min(self.table.tail, (self.table.budget.room(p.tenant_id) + p.held) // 2)  # what fits
            ends = int(poll["stdout_size"]), int(poll["stderr_size"])
            if self.ends is not None:  # an ended stream does not grow: what it seems to add is not its output
                ends = min(ends[0], self.ends[0]), min(ends[1], self.ends[1])
            self.ends = ends
            p.out.skip_to(ends[0] - tail)
            p.err.skip_to(ends[1] - tail)
            p.settle()
        self.draining = True
        return True

    def idle_delay(self, quiet: float) -> float:
        with self.p.cond:  # a client waits, or reads now and then: new output must not wait long
            reading = bool(self.p.waiters) or time.monotonic() - self.p.last_read < QUIET_AFTER
        return self.poll_idle if reading else super().idle_delay(quiet)

    def lost(self, e: Exception) -> str:
        if not isinstance(e, SandboxError):
            return f"following the process failed: {type(e).__name__}"
        if e.http_status == 404:
            # destroyed under it (a pause, a close): not the box forgetting the process
            if not box_alive(self.p.provider, self.p.instance_id):
                return BOX_ENDED
            return f"the box no longer knows process {self.p.pid}"
        return f"the process was lost with its box ({e.code}: {e.message})"

    def dropped(self) -> str | None:
        with self.p.cond:
            if self.p.ended:  # the table ended it as lost: its box ended under it
                return self.p.error or "the session's box changed"
        return None if self.table.tracked(self.p) else "the session's box changed"

    def expire(self) -> None:
        super().expire()
        with self.p.cond:
            self.p.timed_out = True

    def pause(self, delay: float) -> None:
        with self.p.cond:
            self.p.cond.wait(delay)

    def ended(self) -> None:
        p = self.p
        self.table.finished(p, lost=self.error is not None)  # before a reader hears of the end
        with p.cond:
            if not p.ended:  # else it ended with its last poll, or the table ended it as lost
                p.error = self.error
                p.ended, p.ended_at = True, time.time()
            p.changed()
            if not p.reader_active(time.monotonic()):
                p.keep_tail(self.table.tail)
        if self.error is not None:
            self.table.sweep()  # its box is likely gone: what a session that ended left goes with it

