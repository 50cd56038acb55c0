"""One follower for a background process in a box, shared by the HTTP API (``background.py``) and
the E2B facade (``e2b_compat/envd_bg.py``), so both end, time out, retry and audit alike.

A follower thread polls the in-box agent (``providers/agent_procs.py`` ``poll_process``) from byte
offsets until the process ends: ``POLL_FAST`` after output, backing off to ``poll_idle`` when quiet,
and to ``poll_quiet`` once it was quiet for ``QUIET_AFTER`` seconds (a sleeping server need not
cost the service a poll every 100 ms; a subclass polls faster while a reader waits).
When the deadline passes it kills the whole job (SIGKILL to its process tree); a busy agent (a long
file operation) is asked again; a failed poll means the box is lost. The end is audited with one
rule (``end_status``). What differs per interface are hooks: where output goes (a buffer read by
offsets, an event stream), whether it must wait (a full buffer), how a loss reads, what the end does.

``Budget`` bounds what background processes cost the service, one per replica and shared by the
HTTP API, MCP and the E2B facade: the bytes of output it holds (in all, and per tenant; past
them a follower stops taking output, which waits in the box, where the agent pauses the job once
8 MiB wait: nothing is lost while the box lives, unless code in the box deletes it) and the
processes a tenant runs at once. A tenant running a process may always hold up to its floor, so a
few tenants that fill the service-wide budget cannot stall everyone else's output.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..errors import RateLimitError, SandboxError
from ..providers.base import SandboxProvider
from .executions import RunService, RunSpec

POLL_FAST = 0.002
POLL_FULL = 0.25  # output must wait (a full buffer): look for the process's end (a kill) only
QUIET_AFTER = 10.0  # seconds without output after which a process is polled every ``poll_quiet``


class Budget:
    """Output bytes held for background processes (in all and per tenant) and processes running
    per tenant. Thread-safe; ``take`` grants at most what fits, ``charge`` books a change.

    What fits for a tenant: never more than ``tenant_hold_bytes`` in all; within that, what is left
    of the shared ``hold_bytes`` (all tenants together) or, while the tenant runs a process, up to
    ``tenant_floor_bytes`` whatever the others hold. Without a floor, a few tenants that each fill
    their own budget (4 x 64 MiB = 256 MiB) would spend the shared one, and every other tenant's
    output would wait in its box until they read: a denial of service across tenants.

    The bound: a grant from the shared part leaves the total at most ``hold_bytes``, and one under
    the floor raises the tenant's held bytes no higher than its floor, so (induction over grants
    and frees) the total stays within ``hold_bytes + tenant_floor_bytes * T``, T being the tenants
    holding output at once (only a tenant running a process gets its floor, so these run or lately
    ran one in a session: SANDBOX_MAX_SESSIONS in all, 256 + 4 x 50 = 456 MiB at the defaults),
    plus what ``charge`` books past it (a process's last output, as before). The floors are on top of the
    shared budget rather than reserved inside it: a reserve could only be sized for a fixed number
    of tenants, and the tenants who filled the shared part cannot be made to give bytes back (that
    takes their clients reading), so a reserve would again stall the tenant one past that number.
    """

    def __init__(self, hold_bytes: int, tenant_hold_bytes: int, tenant_max_processes: int,
                 tenant_floor_bytes: int = 0) -> None:
        self.hold_bytes, self.tenant_hold_bytes = hold_bytes, tenant_hold_bytes
        self.tenant_floor_bytes = max(0, min(tenant_floor_bytes, tenant_hold_bytes))
        self.tenant_max_processes = tenant_max_processes
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._total = 0
        self._running: dict[str, int] = {}

    @classmethod
    def from_settings(cls, settings: Any) -> Budget:
        return cls(settings.background_hold_bytes, settings.tenant_background_hold_bytes,
                   settings.tenant_max_background_processes, background_floor(settings))

    def held(self, tenant: str | None = None) -> int:
        with self._lock:
            return self._total if tenant is None else self._held.get(tenant, 0)

    def room(self, tenant: str) -> int:
        with self._lock:
            return self._room(tenant)

    def _room(self, tenant: str) -> int:
        held = self._held.get(tenant, 0)
        shared = self.hold_bytes - self._total
        if self._running.get(tenant):  # its floor, whatever the other tenants hold
            shared = max(shared, self.tenant_floor_bytes - held)
        return max(0, min(self.tenant_hold_bytes - held, shared))

    def take(self, tenant: str, want: int) -> int:
        """Book up to ``want`` bytes for ``tenant``: how many fit."""
        with self._lock:
            got = min(want, self._room(tenant))
            self._book(tenant, got)
            return got

    def charge(self, tenant: str, delta: int) -> None:
        """Book ``delta`` bytes (negative: freed), whether they fit or not (a process's last output)."""
        if delta:
            with self._lock:
                self._book(tenant, delta)

    def _book(self, tenant: str, delta: int) -> None:
        held = self._held.get(tenant, 0) + delta
        if held > 0:
            self._held[tenant] = held
        else:
            self._held.pop(tenant, None)
        self._total += delta

    def running(self, tenant: str) -> int:
        with self._lock:
            return self._running.get(tenant, 0)

    def share(self, tenant: str, cap: int) -> int:
        """Bytes one stream (a buffer, an E2B listener's queue) may hold: ``cap``, or its fair
        share of the tenant's budget, so a few unread processes cannot starve one being read."""
        return max(1, min(cap, self.tenant_hold_bytes // (2 * max(1, self.running(tenant)))))

    def check(self, tenant: str) -> None:
        """SB008 (429) when ``tenant`` runs as many background processes as it may."""
        if self.running(tenant) >= self.tenant_max_processes:
            raise self._full()

    def admit(self, tenant: str) -> None:
        """Count one more running process of ``tenant``; SB008 (429) at the cap."""
        with self._lock:
            n = self._running.get(tenant, 0)
            if n >= self.tenant_max_processes:
                raise self._full()
            self._running[tenant] = n + 1

    def leave(self, tenant: str) -> None:
        with self._lock:
            n = self._running.get(tenant, 0) - 1
            if n > 0:
                self._running[tenant] = n
            else:
                self._running.pop(tenant, None)

    def _full(self) -> RateLimitError:
        cap = self.tenant_max_processes
        return RateLimitError(f"too many background processes running for this tenant (max {cap}, "
                              "SANDBOX_TENANT_MAX_BACKGROUND_PROCESSES); wait for or signal one first",
                              details={"limit": cap, "reason": "tenant_max_background_processes"})


def background_floor(settings: Any) -> int:
    """``tenant_background_floor_bytes``, or when unset a sixteenth of the tenant's budget (4 MiB
    at the defaults)."""
    floor = getattr(settings, "tenant_background_floor_bytes", None)
    return settings.tenant_background_hold_bytes // 16 if floor is None else int(floor)


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
    poll_quiet = 1.0
    """The pause between polls of a process quiet for ``QUIET_AFTER`` seconds."""
    log = logging.getLogger("execbox.service.background")

    def __init__(self, provider: SandboxProvider, instance_id: str, pid: int, deadline: float | None,
                 runs: RunService, spec: RunSpec, started: float) -> None:
        self.provider, self.instance_id, self.pid = provider, instance_id, pid
        self.deadline = deadline  # time.monotonic() past which the job is killed; None: never
        self.runs, self.spec, self.started = runs, spec, started
        self.timed_out = False
        self.last: dict[str, Any] | None = None
        self.error: str | None = None
        self.budget: Budget | None = None  # set with tenant: the running process is counted until it ends
        self.tenant = ""

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

    def skip(self, poll: dict[str, Any]) -> bool:
        """The process ended in the box while its output must wait (``poll`` has the streams'
        ``stdout_size``/``stderr_size``): True when the offsets moved and polling goes on at once."""
        return False

    def dropped(self) -> str | None:
        """Why to stop following a running process; None: go on."""
        return None

    def expire(self) -> None:
        """The deadline passed (the kill follows)."""
        self.timed_out = True

    def pause(self, delay: float) -> None:
        time.sleep(delay)

    def idle_delay(self, quiet: float) -> float:
        """The longest pause between polls of a process that has written nothing for ``quiet`` s."""
        return self.poll_idle if quiet < QUIET_AFTER else self.poll_quiet

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._follow()
        finally:
            if self.budget is not None:  # before the readers hear of the end: a new start fits
                self.budget.leave(self.tenant)
        self.ended()
        exit_code = self.last.get("exit_code") if self.last else None
        try:
            self.runs.record(self.spec, self.provider.name, self.instance_id, self.started,
                             end_status(self.last, self.timed_out), exit_code, "SB005" if self.timed_out else None)
        except Exception:  # noqa: BLE001 - auditing must not break the follower's end
            self.log.exception("recording process %s failed", self.pid)

    def _follow(self) -> None:
        delay = POLL_FAST
        last_output = time.monotonic()
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
            elif v.get("ended") and self.skip(v):  # over in the box: go on from where skip left
                full = False
            if v.get("exited"):
                self.last = v
                break
            self.error = self.dropped()
            if self.error is not None:
                break
            now = time.monotonic()
            if v["stdout"] or v["stderr"]:
                last_output, delay = now, POLL_FAST
            else:
                delay = min(delay * 2, self.idle_delay(now - last_output))
            if full:
                delay = POLL_FULL
            self.pause(delay)
