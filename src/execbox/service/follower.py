"""One follower for a background process in a box, shared by the HTTP API (``background.py``) and
the E2B facade (``e2b_compat/envd_bg.py``), so both end, time out, retry and audit alike.

A follower thread polls the in-box agent (``providers/agent_procs.py`` ``poll_process``) from byte
offsets until the process ends: ``POLL_FAST`` after output, backing off to ``poll_idle`` when quiet.
When the deadline passes it kills the whole job (SIGKILL to its process tree); a busy agent (a long
file operation) is asked again; a failed poll means the box is lost. The end is audited with one
rule (``end_status``). What differs per interface are hooks: where output goes (a buffer read by
offsets, an event stream), whether it must wait (a full buffer), how a loss reads, what the end does.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..errors import SandboxError
from ..providers.base import SandboxProvider
from .executions import RunService, RunSpec

POLL_FAST = 0.002
POLL_FULL = 0.25  # output must wait (a full buffer): look for the process's end (a kill) only


def end_status(last: dict[str, Any] | None, timed_out: bool) -> str:
    """How a followed process ended, as its audit row says: ``last`` is its final poll (None when
    it was lost)."""
    if timed_out:
        return "timeout"
    if last is None:
        return "error"
    if last.get("signal"):
        return "cancelled"
    return "success" if last.get("exit_code") == 0 else "failed"


class Follower:
    """Follows one process until it ends (``run``, a thread body), then audits it.

    After ``run``: ``last`` is the final poll (``exited``, ``exit_code``, ``signal``) or None when
    the process was lost, ``error`` says why it was lost, ``timed_out`` whether the deadline
    killed it. Subclasses deliver output (``offsets``, ``take``) and the end (``ended``).
    """

    poll_idle = 0.1
    """The longest pause between polls of a quiet process, and after a busy agent."""
    log = logging.getLogger("execbox.service.background")

    def __init__(self, provider: SandboxProvider, instance_id: str, pid: int, deadline: float | None,
                 runs: RunService, spec: RunSpec, started: float) -> None:
        self.provider, self.instance_id, self.pid = provider, instance_id, pid
        self.deadline = deadline  # time.monotonic() past which the job is killed; None: never
        self.runs, self.spec, self.started = runs, spec, started
        self.timed_out = False
        self.last: dict[str, Any] | None = None
        self.error: str | None = None

    def start(self, name: str) -> None:
        threading.Thread(target=self.run, name=name, daemon=True).start()

    # -- hooks ---------------------------------------------------------------------------------
    def offsets(self) -> tuple[int, int, bool]:
        """(stdout offset, stderr offset) to poll from, and whether new output must wait."""
        raise NotImplementedError

    def take(self, poll: dict[str, Any]) -> None:
        """Deliver one poll's ``stdout``/``stderr`` bytes, and the end when it has ``exited``."""
        raise NotImplementedError

    def ended(self) -> None:
        """The process ended (``last``, ``error``, ``timed_out`` are final): tell its readers."""
        raise NotImplementedError

    def lost(self, e: Exception) -> str:
        """Why the process is lost, when a poll failed with ``e``."""
        return f"{e.code}: {e.message}" if isinstance(e, SandboxError) else str(e)

    def dropped(self) -> str | None:
        """Why to stop following a running process; None: go on."""
        return None

    def expire(self) -> None:
        """The deadline passed (the kill follows)."""
        self.timed_out = True

    def pause(self, delay: float) -> None:
        time.sleep(delay)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        delay = POLL_FAST
        while True:
            if self.deadline is not None and not self.timed_out and time.monotonic() >= self.deadline:
                self.expire()
                try:
                    self.provider.signal_process(self.instance_id, self.pid, "SIGKILL")
                except SandboxError:
                    pass
            out_off, err_off, full = self.offsets()
            try:
                v = self.provider.poll_process(self.instance_id, self.pid, out_off, err_off)
            except SandboxError as e:
                if e.details.get("busy"):  # the agent is in a long file operation: ask again
                    time.sleep(self.poll_idle)
                    continue
                self.error = self.lost(e)
                break
            except Exception as e:  # noqa: BLE001 - reported on the process; the server stays up
                self.log.exception("following process %s failed", self.pid)
                self.error = self.lost(e)
                break
            if not full or v.get("exited"):  # the end is taken with its output, full or not
                self.take(v)
            if v.get("exited"):
                self.last = v
                break
            self.error = self.dropped()
            if self.error is not None:
                break
            got = bool(v["stdout"] or v["stderr"])
            delay = POLL_FULL if full else POLL_FAST if got else min(delay * 2, self.poll_idle)
            self.pause(delay)
        self.ended()
        exit_code = self.last.get("exit_code") if self.last else None
        try:
            self.runs.record(self.spec, self.provider.name, self.instance_id, self.started,
                             end_status(self.last, self.timed_out), exit_code, "SB005" if self.timed_out else None)
        except Exception:  # noqa: BLE001 - auditing must not break the follower's end
            self.log.exception("recording process %s failed", self.pid)
