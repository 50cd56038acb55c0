"""Adoption of background processes, their public ids, and their places under the tenant's cap:
the part of ``ProcessTable`` (``background.py``) that deals with what outlives one service life.

Processes outlive the service that started them when their box does (a Docker container is left
running at a restart and re-attached; another replica takes a session over). The first time this
replica deals with a session's box (``adopt``, before any listing, read or start there) it asks
the agent for its processes (``proc.list``) and follows each one this API started (``proc.start``
was given ``start_meta``, which the agent keeps and lists verbatim) as if it had started it: same
public id, command, cwd, start time, timeout and stdin, its output from the first byte the box
still holds (what the box already freed is counted as dropped), counted against the tenant's cap.

Public ids. A process is known to clients by its ``pid``: its pid in the box, except when that
collides with an id the session's table still holds (a process of the session's earlier box,
kept as ``lost``; an ended one): then it gets an alias above the kernel's pid range
(``ALIAS_BASE`` + n, n counting up per session), so an id never means two processes while the
table remembers them (review 35, F1: every new box is a fresh pid namespace, whose first process
gets the same small pid as the dead box's). Its pid in the box is ``box_pid``, which every agent
call uses. A start does not know its pid before the agent answers, and the agent keeps ``meta``
only as given at the start, so ``id_plan`` puts in the meta the alias reserved for the start and
the ids it would collide with (``taken``); the public id is the alias when the pid is one of them
(``public_id``), both at the start and at a later adoption.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import TYPE_CHECKING, Any

from ..errors import SandboxError
from ..providers.base import SandboxProvider
from .executions import RunSpec

if TYPE_CHECKING:
    from collections import OrderedDict

    from .background import BgProcess
    from .follower import Budget

log = logging.getLogger("execbox.service.background")

OPERATION = "background_command"
META_API = "http"
"""``meta.api`` of the processes this API starts (the E2B facade's carry none): only those are adopted."""
ADOPT_WAIT = 35.0
"""Seconds a request waits for another one's adoption of the same box (longer than one agent call)."""
ADOPT_MAX = 64
"""Processes adopted from one box at most (the agent runs at most 64)."""
BOXES_KEPT = 4096
"""Boxes remembered as adopted, and sessions whose last alias is remembered; past it the oldest
is forgotten (a box: its next request lists it again; a session: its next alias starts above the
ids its table holds)."""
ALIAS_BASE = 1 << 22
"""Public ids above it are aliases: Linux never hands out a pid at or above 2**22 (PID_MAX_LIMIT,
the highest ``kernel.pid_max`` may be set to on 64-bit), in any pid namespace, so an alias can
never equal a pid in a box; aliases stay far below 2**31 (the routes' bound)."""
MAX_ID = 2**31 - 1
BOX_ENDED = ("its box ended under it: the session's box died or was replaced (a crash, the OOM killer, a "
             "pause, a provider switch), and the session has a new one")
"""The ``error`` of a process of the session's earlier box that its follower had not seen end."""
_AUDIT_KEY = re.compile(r"[0-9a-f]{32}")


def no_call(*_: Any) -> Any:
    """The ``call`` of a process's RunSpec: a process request runs no code."""
    raise AssertionError("a process request runs no code")


def box_alive(provider: SandboxProvider, instance_id: str) -> bool:
    """Whether the box still runs; a provider that cannot tell counts as yes (keep what we have).
    One check for the process table's sweep and both followers (HTTP and the E2B facade)."""
    check = getattr(provider, "instance_alive", None)
    try:
        return True if check is None else bool(check(instance_id))
    except Exception:  # noqa: BLE001 - cannot tell
        return True


def supports(provider: SandboxProvider) -> bool:
    return bool(getattr(provider, "supports_background_processes", False))


def start_meta(tenant_id: str, session_id: str, cwd: str | None, stdin: bool, timeout: float | None,
               started_at: float, audit_key: str | None, ids: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``proc.start`` leaves with the agent for a later service to adopt the process by
    (returned verbatim by ``proc.list``; the agent bounds it at 32 KiB as UTF-8 JSON). ``ids``: the
    start's ``id_plan`` (``alias`` and ``taken``), when it has one."""
    return {"api": META_API, "tenant": tenant_id, "session": session_id, "cwd": cwd, "stdin": bool(stdin),
            "timeout": timeout, "started_at": started_at, "audit": audit_key, **(ids or {})}


def public_id(box_pid: int, plan: dict[str, Any] | None) -> int:
    """The id clients know a process by: its pid in the box, or the start's alias when that pid
    is one its session's table held at the start (``plan``: the ``id_plan``, or the adopted
    process's meta; anything malformed there counts as no plan)."""
    if not plan:
        return box_pid
    alias, taken = plan.get("alias"), plan.get("taken")
    if (isinstance(alias, int) and not isinstance(alias, bool) and ALIAS_BASE < alias <= MAX_ID
            and isinstance(taken, list) and box_pid in taken):
        return alias
    return box_pid


class ProcessAdoption:
    """``ProcessTable``'s adoption, ids and cap bookkeeping (the table's state is its own)."""

    _lock: threading.Lock
    _procs: dict[tuple[str, str], dict[int, BgProcess]]
    _boxes: dict[tuple[str, str, str], threading.Event]
    _over: dict[str, list[BgProcess]]
    _aliases: OrderedDict[tuple[str, str], int]
    _sessions: Any  # the session manager (``get``), or None
    budget: Budget
    tail: int

    def _follow(self, proc: BgProcess, spec: RunSpec) -> None:
        raise NotImplementedError

    def _incarnation(self, tenant_id: str, session_id: str) -> Any:
        """The session's live record on this replica (its processes belong to it: a session closed
        and made again under its name is another), None when it has ended here or is not loaded (or
        the table has no session manager: a test's)."""
        if self._sessions is None:
            return None
        s = self._sessions.get(tenant_id, session_id)
        return None if s is None or getattr(s, "closed", False) else s

    # -- public ids ------------------------------------------------------------------------------
    def id_plan(self, tenant_id: str, session_id: str) -> dict[str, Any]:
        """For a start in the session: an alias reserved for it and the ids its pid must not take
        (those of the session's table that are pids), for ``start_meta`` and ``public_id``; empty
        when the table holds none (the pid is the id)."""
        key = (tenant_id, session_id)
        with self._lock:
            table = self._procs.get(key, {})
            taken = sorted(pid for pid in table if pid < ALIAS_BASE)
            if not taken:
                return {}
            alias = max([self._aliases.get(key, ALIAS_BASE), *table]) + 1
            if alias > MAX_ID:  # two billion aliases in one session: count again above the ids held
                alias = max([ALIAS_BASE, *(p for p in table if p < MAX_ID)]) + 1
                self._aliases[key] = ALIAS_BASE
            self._note_alias(key, alias)
        return {"alias": alias, "taken": taken}

    def _note_alias(self, key: tuple[str, str], alias: int) -> None:
        """Call with ``_lock`` held: ``alias`` is handed out (or adopted) in the session."""
        if alias > ALIAS_BASE:
            self._aliases[key] = max(alias, self._aliases.get(key, 0))
            self._aliases.move_to_end(key)
            while len(self._aliases) > BOXES_KEPT:
                self._aliases.popitem(last=False)

    # -- adoption --------------------------------------------------------------------------------
    def adopt(self, provider: SandboxProvider, tenant_id: str, session_id: str, instance_id: str) -> None:
        """The first time this replica deals with the session's box: track and follow the
        processes an earlier service (this replica before a restart, or the session's previous
        owner) started there through this API and the box still runs or has not reported ended.
        Later calls for the box return at once (a concurrent one waits for the first). A box
        that cannot be listed now is listed again at the next request. The adopted ones are
        counted against ``tenant_max_background_processes``; those past it are adopted anyway
        (said by ``over_tenant_cap`` and a warning) and keep new starts refused until enough end."""
        key = (tenant_id, session_id, instance_id)
        with self._lock:
            done = self._boxes.get(key)
            mine = done is None
            if done is None:
                for other in [k for k in self._boxes if k[:2] == key[:2]]:
                    del self._boxes[other]  # the session's earlier box
                while len(self._boxes) >= BOXES_KEPT:
                    del self._boxes[next(iter(self._boxes))]
                done = self._boxes[key] = threading.Event()
        if not mine:
            done.wait(ADOPT_WAIT)
            return
        try:
            listing = getattr(provider, "list_processes", None)
            entries = listing(instance_id) if supports(provider) and listing is not None else []
        except Exception as e:  # noqa: BLE001 - the request goes on; its own agent call says what is wrong
            log.warning("listing the processes of box %s of session %s/%s failed: %s", instance_id,
                        tenant_id, session_id, e)
            with self._lock:
                if self._boxes.get(key) is done:
                    del self._boxes[key]
            done.set()
            return
        try:
            for entry in entries[:ADOPT_MAX]:
                got = self._adoptee(provider, tenant_id, session_id, instance_id, entry)
                if got is not None:
                    self._take_over(*got)
        finally:
            done.set()

    def _adoptee(self, provider: SandboxProvider, tenant_id: str, session_id: str, instance_id: str,
                 entry: Any) -> tuple[BgProcess, RunSpec] | None:
        """The record of one ``proc.list`` entry to adopt, or None: not started through this API
        (the E2B facade's, or listed by an agent that keeps no ``meta``), another session's (never
        adopted: the box is one session's), or not well formed (the box is not trusted)."""
        from .background import BgProcess  # background.py builds ProcessTable on this mixin

        meta = entry.get("meta") if isinstance(entry, dict) else None
        if not isinstance(meta, dict) or meta.get("api") != META_API:
            return None
        if meta.get("tenant") != tenant_id or meta.get("session") != session_id:
            log.warning("box %s of session %s/%s lists process %r of another session; not adopted",
                        instance_id, tenant_id, session_id, entry.get("pid"))
            return None
        try:
            box_pid, command = int(entry["pid"]), str(entry["command"])
            started_at = float(meta.get("started_at") or entry.get("started") or time.time())
            timeout = None if meta.get("timeout") is None else float(meta["timeout"])
            firsts = max(0, int(entry.get("stdout_from") or 0)), max(0, int(entry.get("stderr_from") or 0))
        except (KeyError, TypeError, ValueError):
            return None
        cwd = meta.get("cwd") if isinstance(meta.get("cwd"), str) else None
        now, mono = time.time(), time.monotonic()
        proc = BgProcess(public_id(box_pid, meta), command, cwd, tenant_id, session_id, provider, instance_id,
                         bool(entry.get("stdin")), timeout, started_at=started_at,
                         started_mono=mono - max(0.0, now - started_at), adopted=True, box_pid=box_pid)
        proc.stdin_closed = bool(meta.get("stdin")) and not proc.stdin  # an earlier request closed it
        for stream, first in ((proc.out, firsts[0]), (proc.err, firsts[1])):
            stream.base = stream.dropped = first  # freed by the box once an earlier service took it
        audit = meta.get("audit")
        spec = RunSpec(tenant_id, session_id, OPERATION, "bash", command, None, no_call,
                       inflight=audit if isinstance(audit, str) and _AUDIT_KEY.fullmatch(audit) else None)
        return proc, spec

    def _take_over(self, proc: BgProcess, spec: RunSpec) -> None:
        """Track and follow an adopted process, unless this replica follows it already. One it
        tracks under the same id as ended, or in another box, is replaced: the box still lists
        this one, so this replica lost it (a box it let go of and took back), or the other is
        another life's."""
        tenant = proc.tenant_id
        try:
            self.budget.admit(tenant)
            counted = True
        except SandboxError:
            counted = False
        proc.session = self._incarnation(tenant, proc.session_id)
        with self._lock:
            key = (tenant, proc.session_id)
            table = self._procs.setdefault(key, {})
            old = table.get(proc.pid)
            known = old is not None and not old.ended and old.instance_id == proc.instance_id
            if not known:
                table[proc.pid] = proc
                self._note_alias(key, proc.pid)
                proc.budget = self.budget
                proc.counted = counted
                if not counted:
                    proc.over_cap = True
                    self._over.setdefault(tenant, []).append(proc)
        if known:
            if counted:
                self.budget.leave(tenant)
            return
        if old is not None:
            self.lose(old, "the session's box ended under it")  # one of another box (no-op: ended)
            old.forget()
        if not counted:
            log.warning("tenant %s runs more background processes than it may (%d) with process %d adopted "
                        "from session %s; new ones are refused until enough end", tenant,
                        self.budget.tenant_max_processes, proc.pid, proc.session_id)
        self._follow(proc, spec)

    # -- places under the tenant's cap -----------------------------------------------------------
    def lose(self, proc: BgProcess, why: str) -> None:
        """End ``proc`` as ``lost`` (``error``: ``why``) unless it has ended: its box ended under it
        before its follower saw it. It leaves the tenant's count first (its follower, which stops
        at its next look, changes nothing more), and its unread output is kept as an ended one's."""
        self.finished(proc)
        with proc.cond:
            if proc.ended:
                return
            proc.error, proc.ended, proc.ended_at = why, True, time.time()
            proc.changed()
            if not proc.reader_active(time.monotonic()):
                proc.keep_tail(self.tail)

    def finished(self, proc: BgProcess, lost: bool = False) -> None:
        """A process ended, or is lost (before its readers hear of it): it leaves the tenant's
        count if it is counted (once: later calls change nothing), an adoptee past the cap frees
        its place in the queue, and the next waiting adoptee of the tenant may be counted.
        ``lost`` (following it failed): the next request for its box lists the box again (what it
        still runs is adopted anew)."""
        with self._lock:
            if lost:
                self._boxes.pop((proc.tenant_id, proc.session_id, proc.instance_id), None)
            over = self._over.get(proc.tenant_id, [])
            if proc in over:
                over.remove(proc)
                proc.over_cap = False
                if not over:
                    self._over.pop(proc.tenant_id, None)
            if proc.counted:
                proc.counted = False
                self.budget.leave(proc.tenant_id)
        self._promote(proc.tenant_id)

    def _promote(self, tenant_id: str) -> None:
        """Count adoptees that were past the tenant's cap, as far as the cap now allows."""
        with self._lock:
            over = self._over.get(tenant_id)
            while over:
                try:
                    self.budget.admit(tenant_id)
                except SandboxError:
                    break
                p = over.pop(0)
                p.over_cap, p.counted = False, True
            if over is not None and not over:
                self._over.pop(tenant_id, None)
