"""The E2B facade's process table (envd_process.ProcTable): a pid names one process for the
sandbox's life (review 38, F3). The SDK-level check is
tests/integration/e2b_compat/test_process_ids.py; these cover what a real box cannot stage on
demand: a collision with a process whose follower has not yet seen its box die, the bound on the
remembered pids, and a request that meets the dead box."""

from __future__ import annotations

import anyio
import pytest
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from protobuf import Oneof

from execbox.errors import ProviderUnavailableError
from execbox.service.bg_adopt import ALIAS_BASE
from execbox.service.e2b_compat import envd_process
from execbox.service.e2b_compat.envd_bg import Proc
from execbox.service.e2b_compat.envd_gen.process import process_pb as pb
from execbox.service.e2b_compat.envd_process import ENDED_KEPT, ProcessService, ProcTable


def _by_pid(pid: int) -> pb.ProcessSelector:
    return pb.ProcessSelector(selector=Oneof("pid", pid))


def _add(table: ProcTable, box_pid: int, tag: str | None = None) -> Proc:
    return table.add(box_pid, lambda pid: Proc(pid, pb.ProcessConfig(), tag, background=True, box_pid=box_pid))


def _not_found(table: ProcTable, selector: pb.ProcessSelector) -> str:
    with pytest.raises(ConnectError) as e:
        table.find(selector)
    assert e.value.code == Code.NOT_FOUND
    return e.value.message


def test_a_free_pid_is_the_box_pid() -> None:
    table = ProcTable()
    p = _add(table, 4)
    assert (p.pid, p.box_pid) == (4, 4) and table.find(_by_pid(4)) is p and table.running() == [p]


def test_a_pid_a_running_process_holds_gets_an_alias() -> None:
    """The old box's process is still followed (its death not yet seen) when the new box's gets its pid."""
    table = ProcTable()
    old = _add(table, 4)
    new = _add(table, 4)
    assert new.pid == ALIAS_BASE + 1 and new.box_pid == 4
    assert table.find(_by_pid(4)) is old and table.find(_by_pid(new.pid)) is new
    table.ended(old)
    assert "ended" in _not_found(table, _by_pid(4))
    assert table.find(_by_pid(new.pid)) is new and table.running() == [new]


def test_an_ended_pid_is_remembered_and_never_handed_out_again() -> None:
    table = ProcTable()
    old = _add(table, 4)
    table.ended(old)
    assert _not_found(table, _by_pid(4)) == "process with pid 4 not found (it ended)"
    a, b = _add(table, 4), _add(table, 4)  # two more box deaths
    assert (a.pid, b.pid) == (ALIAS_BASE + 1, ALIAS_BASE + 2)
    table.ended(a)
    assert _not_found(table, _by_pid(a.pid)).endswith("(it ended)")
    assert table.find(_by_pid(b.pid)) is b
    assert _not_found(table, _by_pid(99)) == "process with pid 99 not found"


def test_a_finished_process_is_not_found_before_it_is_forgotten() -> None:
    table = ProcTable()
    p = _add(table, 7, tag="t")
    assert table.find(pb.ProcessSelector(selector=Oneof("tag", "t"))) is p
    p.done = True  # its end published; the follower forgets it next
    _not_found(table, _by_pid(7))
    _not_found(table, pb.ProcessSelector(selector=Oneof("tag", "t")))
    assert table.running() == []


def test_the_remembered_pids_are_bounded() -> None:
    table = ProcTable()
    for pid in range(10, 10 + ENDED_KEPT + 1):
        table.ended(_add(table, pid))
    assert _add(table, 10).pid == 10  # the oldest is forgotten
    assert _add(table, 11).pid > ALIAS_BASE  # the next one is still remembered


def test_aliases_count_again_past_the_top() -> None:
    table = ProcTable()
    table.ended(_add(table, 4))
    table._alias = envd_process.MAX_ID
    assert _add(table, 4).pid == ALIAS_BASE + 1


class _DeadBox:
    def signal_process(self, instance_id: str, pid: int, sig: str) -> None:
        raise ProviderUnavailableError("the agent is gone")

    def instance_alive(self, instance_id: str) -> bool:
        return False


def test_a_request_that_meets_the_dead_box_is_not_found() -> None:
    """Before the follower saw the box die: envd's answer for a process it no longer runs."""
    proc = Proc(ALIAS_BASE + 3, pb.ProcessConfig(), None, _DeadBox(), "i1", background=True, box_pid=4)  # type: ignore[arg-type]
    with pytest.raises(ConnectError) as e:
        anyio.run(ProcessService(None)._bg, proc, "signal_process", "SIGKILL")  # type: ignore[arg-type]
    assert e.value.code == Code.NOT_FOUND and str(ALIAS_BASE + 3) in e.value.message
