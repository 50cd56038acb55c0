"""How a dead docker box's OOM is read from the engine.

The race this guards (runsc: the shim reports the sandbox's exit before its OOM, so State.OOMKilled
stays false and only the ``oom`` event tells) cannot be produced on demand with a real engine; the
engine's answers are scripted here. tests/integration/docker/test_execution.py and the conformance
memory bomb run the real thing.
"""

from __future__ import annotations

from typing import Any

from execbox.boxes.docker_oom import engine_oom


class Engine:
    def __init__(self, state: dict[str, Any] | None, events: list[dict[str, Any]] | None = None) -> None:
        self.state, self.events_out = state, events or []
        self.waited = False
        self.asked: list[dict[str, Any]] = []

    def wait(self, container_id: str, timeout: float) -> None:
        self.waited = True

    def inspect_container(self, container_id: str) -> dict[str, Any]:
        if self.state is None:
            raise RuntimeError("no such container")
        return {"State": self.state}

    def events(self, **kw: Any) -> list[dict[str, Any]]:
        self.asked.append(kw)
        return [e for e in self.events_out if e["id"] == kw["filters"]["container"]]


def exited(code: int, oom_killed: bool = False) -> dict[str, Any]:
    return {"Running": False, "ExitCode": code, "OOMKilled": oom_killed}


def test_oomkilled_state_is_enough():
    api = Engine(exited(137, oom_killed=True))
    assert engine_oom(api, "c1", since=1000.0, settle=True) is True
    assert api.waited and not api.asked


def test_a_late_oom_event_counts_when_the_state_missed_it():
    api = Engine(exited(137), [{"id": "c1", "status": "oom", "Action": "oom"}])
    assert engine_oom(api, "c1", since=1000.5, settle=True) is True
    (asked,) = api.asked
    assert asked["since"] == 999 and asked["until"] > asked["since"]
    assert asked["filters"] == {"container": "c1", "event": "oom"}


def test_a_sigkill_without_oom_event_is_not_an_oom():
    api = Engine(exited(137), [{"id": "other", "status": "oom", "Action": "oom"}])
    assert engine_oom(api, "c1", since=1000.0, settle=True) is False


def test_other_deaths_never_ask_for_events():
    for state in (exited(1), exited(0), {"Running": True, "ExitCode": 0, "OOMKilled": False}):
        api = Engine(state, [{"id": "c1", "status": "oom", "Action": "oom"}])
        assert engine_oom(api, "c1", since=1000.0, settle=False) is False
        assert not api.asked and not api.waited


def test_a_removed_container_gives_no_verdict():
    assert engine_oom(Engine(None), "c1", since=1000.0, settle=True) is False
