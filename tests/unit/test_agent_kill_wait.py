"""kill_tree keeps at it until every target is dead, bounded by time rather than by a count of
quick rounds (50 of them could pass before a slow SIGKILL landed), and gives up after KILL_WAIT."""

from __future__ import annotations

import os

from execbox.agent import procs

SLOW = 4242  # a pid whose SIGKILL lands late


def test_a_slow_kill_is_waited_for_past_the_quick_rounds(monkeypatch):
    checks = {"n": 0}

    def zombie(pid: int) -> bool:
        checks["n"] += 1
        return checks["n"] > 80  # dead only after 80 looks: well past 50 rounds of 2 ms

    monkeypatch.setattr(procs, "descendants", lambda pid: [SLOW] if pid != SLOW else [])
    monkeypatch.setattr(procs, "children_of", lambda pid: [])
    monkeypatch.setattr(procs, "_zombie", zombie)
    monkeypatch.setattr(procs, "_sid", lambda pid: None)
    monkeypatch.setattr(os, "killpg", lambda *a: None)
    monkeypatch.setattr(os, "kill", lambda *a: None)
    monkeypatch.setattr(procs, "KILL_WAIT", 30.0)
    procs.kill_tree(SLOW + 1, include_root=False)
    assert checks["n"] > 80  # it returned only once the target was seen dead


def test_an_unkillable_target_is_given_up_after_kill_wait(monkeypatch):
    monkeypatch.setattr(procs, "descendants", lambda pid: [SLOW] if pid != SLOW else [])
    monkeypatch.setattr(procs, "children_of", lambda pid: [])
    monkeypatch.setattr(procs, "_zombie", lambda pid: False)
    monkeypatch.setattr(procs, "_sid", lambda pid: None)
    monkeypatch.setattr(os, "killpg", lambda *a: None)
    monkeypatch.setattr(os, "kill", lambda *a: None)
    monkeypatch.setattr(procs, "KILL_WAIT", 0.3)
    procs.kill_tree(SLOW + 1, include_root=False)  # returns (a D-state process must not hang the agent)
