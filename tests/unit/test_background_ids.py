"""Public ids and tombstones of the HTTP API's background processes (service/background.py,
service/bg_adopt.py; review 35, F1), against a scripted multi-box agent: a process whose box
ended under it is kept as ``lost`` while its session lives, and leaves its tenant's count once; a
new process whose pid in its box is an id the session's table holds gets an alias (above the
kernel's pid range), and every agent call names the pid in the box; adoption restores the alias
from the meta the start left with the agent; a new life of the session's name starts empty."""

from __future__ import annotations

import threading
import time
from typing import Any

from execbox.errors import ProviderUnavailableError
from execbox.service.background import ALIAS_BASE, BgProcess, ProcessTable, public_id, start_meta
from execbox.service.config import ServiceSettings
from tests.unit.test_process_followers import SPEC, Runs


class Boxes:
    """Background processes in several boxes, keyed by (box, pid in the box), each running until
    signalled; a dead box fails every call as a dead jail box does (SB009)."""

    name = "fake"
    supports_background_processes = True

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: dict[tuple[str, int], dict[str, Any]] = {}
        self.dead: set[str] = set()
        self.calls: list[tuple[str, str, int]] = []  # (call, box, pid)
        self.listed: list[dict[str, Any]] = []

    def spawn(self, iid: str, pid: int, out: bytes = b"") -> None:
        with self.lock:
            self.procs[(iid, pid)] = {"out": bytearray(out), "exit": None}

    def _get(self, call: str, iid: str, pid: int) -> dict[str, Any]:
        self.calls.append((call, iid, pid))
        if iid in self.dead:
            raise ProviderUnavailableError(f"box {iid} died", details={"box_died": True})
        return self.procs[(iid, pid)]

    def poll_process(self, iid: str, pid: int, out_off: int, err_off: int) -> dict[str, Any]:
        with self.lock:
            p = self._get("poll", iid, pid)
            out = bytes(p["out"][out_off:])
            done = p["exit"] is not None
            return {"stdout": out, "stderr": b"", "exited": done, **(p["exit"] or {})}

    def signal_process(self, iid: str, pid: int, sig: str = "SIGKILL") -> bool:
        with self.lock:
            p = self._get("signal", iid, pid)
            p["exit"] = p["exit"] or {"exit_code": -9, "signal": 9}
            return True

    def instance_alive(self, iid: str) -> bool:
        return iid not in self.dead

    def list_processes(self, iid: str) -> list[dict[str, Any]]:
        return list(self.listed)


class Life:
    """A session's record on this replica (``SessionManager.get``)."""

    closed = False


class Sessions:
    def __init__(self) -> None:
        self.lives: dict[tuple[str, str], Life] = {("t", "s"): Life()}

    def get(self, tenant_id: str, session_id: str) -> Life | None:
        return self.lives.get((tenant_id, session_id))


def make() -> tuple[ProcessTable, Boxes, Sessions, Runs]:
    runs = Runs()
    sessions = Sessions()
    runs.sessions = sessions  # type: ignore[attr-defined]
    return ProcessTable(runs, 8, ServiceSettings()), Boxes(), sessions, runs  # type: ignore[arg-type]


def start(table: ProcessTable, boxes: Boxes, iid: str, box_pid: int, out: bytes = b"") -> BgProcess:
    """As ProcessOps.start does: the plan, the start in the box, the record."""
    plan = table.id_plan("t", "s")
    boxes.spawn(iid, box_pid, out)
    p = BgProcess(box_pid, "cmd", None, "t", "s", boxes, iid, False, None)  # type: ignore[arg-type]
    table.add(p, SPEC, plan)
    return p


def until(check: Any, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.01)


def test_the_public_id_is_the_pid_unless_the_plan_says_it_was_taken() -> None:
    alias = ALIAS_BASE + 3
    assert public_id(4, None) == public_id(4, {}) == 4
    assert public_id(4, {"alias": alias, "taken": [2, 4]}) == alias
    assert public_id(5, {"alias": alias, "taken": [2, 4]}) == 5
    for bad in (True, ALIAS_BASE, 2**31, "4194307", None):  # a meta the box could have changed
        assert public_id(4, {"alias": bad, "taken": [4]}) == 4
    assert public_id(4, {"alias": alias, "taken": "4"}) == 4


def test_plans_reserve_distinct_aliases_above_every_id_held() -> None:
    table, boxes, _, _ = make()
    assert table.id_plan("t", "s") == {}  # nothing held: the pid is the id, the meta unchanged
    start(table, boxes, "i1", 4)
    assert start(table, boxes, "i1", 9).pid == 9  # its plan reserved ALIAS_BASE + 1, unused: 9 was free
    one, two = table.id_plan("t", "s"), table.id_plan("t", "s")
    assert one == {"alias": ALIAS_BASE + 2, "taken": [4, 9]} and two["alias"] == ALIAS_BASE + 3
    assert table.id_plan("t", "other") == {}  # per session
    assert start_meta("t", "s", None, False, None, 1.0, None, one)["taken"] == [4, 9]


def test_a_process_of_a_dead_box_is_lost_and_its_pid_never_names_the_next_boxs_process() -> None:
    table, boxes, _, _ = make()
    old = start(table, boxes, "i1", 4, b"old-output\n")
    other = start(table, boxes, "i1", 5)  # counted too: a second leave would show
    until(lambda: old.read(0, 0)["stdout"] == b"old-output\n")
    assert table.budget.running("t") == 2
    boxes.dead.add("i1")  # the box dies; the session's next request gets a new box, i2

    procs = {p.pid: p for p in table.of_box("t", "s", "i2")}
    assert procs[4] is old and procs[5] is other  # kept, not forgotten
    assert (old.info()["status"], old.info()["running"]) == ("lost", False)
    assert old.info()["error"] and "box" in old.info()["error"]
    assert table.budget.running("t") == 0  # left the tenant's count at once
    assert old.read(0, 0)["stdout"] == b"old-output\n"  # its unread output is kept

    new = start(table, boxes, "i2", 4)  # a fresh pid namespace: the same pid again
    assert new.pid == ALIAS_BASE + 2 and new.box_pid == 4 and new.info()["box_pid"] == 4
    assert table.get("t", "s", "i2", 4) is old and table.get("t", "s", "i2", new.pid) is new
    assert table.budget.running("t") == 1
    until(lambda: ("poll", "i2", 4) in boxes.calls)
    time.sleep(0.3)  # the dead box's followers have ended: neither left the count again
    assert table.budget.running("t") == 1
    assert not [c for c in boxes.calls if c[2] >= ALIAS_BASE]  # the agent only ever hears box pids
    assert old.info()["status"] == "lost" and table.get("t", "s", "i2", 4) is old
    assert start(table, boxes, "i2", 6).pid == 6  # no collision: the pid is the id


def test_a_lost_process_seen_by_its_follower_first_stays_until_its_session_ends() -> None:
    table, boxes, sessions, runs = make()
    p = start(table, boxes, "i1", 4)
    boxes.dead.add("i1")
    until(lambda: p.ended)  # the follower's poll failed: lost, and the table swept
    assert p.status == "lost" and "SB009" in (p.error or "")
    assert table.budget.running("t") == 0 and runs.rows == [("error", None, None)]
    table.sweep()
    assert table.get("t", "s", "i2", 4) is p  # its box is gone, its session lives: kept
    assert start(table, boxes, "i2", 4).pid == ALIAS_BASE + 1

    sessions.lives[("t", "s")].closed = True  # the session ends; a new one of the name is made
    sessions.lives[("t", "s")] = Life()
    boxes.dead.add("i2")
    table.sweep()
    assert table.of_box("t", "s", "i3") == []  # the earlier life's processes are not this one's
    assert table.id_plan("t", "s") == {}


def test_adoption_restores_the_alias_the_start_left_in_the_meta() -> None:
    table, boxes, _, _ = make()
    alias = ALIAS_BASE + 7
    for pid, ids in ((4, {"alias": alias, "taken": [4]}), (5, {"alias": ALIAS_BASE + 8, "taken": [4]})):
        boxes.spawn("i1", pid)
        boxes.listed.append({"pid": pid, "command": f"cmd-{pid}", "stdin": False,
                             "meta": start_meta("t", "s", None, False, None, time.time(), None, ids)})
    table.adopt(boxes, "t", "s", "i1")
    procs = {p.pid: p for p in table.of_box("t", "s", "i1")}
    assert {i: p.box_pid for i, p in procs.items()} == {alias: 4, 5: 5}
    assert procs[alias].info()["adopted"] is True and procs[alias].command == "cmd-4"
    until(lambda: {("poll", "i1", 4), ("poll", "i1", 5)} <= set(boxes.calls))
    assert not [c for c in boxes.calls if c[2] >= ALIAS_BASE]
    assert table.id_plan("t", "s")["alias"] > alias  # never one the session already uses
