"""A workspace volume whose container is gone is removed even while the engine still counts it in
use for a while (a leaked volume failed a CI run: one second of retries was not enough). Boxes no
longer get volumes (boxes/docker_host.py); shutdown still removes those an older execbox left."""

from __future__ import annotations

import pytest

from execbox.boxes import docker_box


class FakeApi:
    def __init__(self, busy_for: int, error: str = "remove execbox-ws-x: volume is in use - [abc]") -> None:
        self.busy_for, self.error, self.calls = busy_for, error, 0
        self.volumes = {"execbox-ws-x"}

    def remove_volume(self, name: str, force: bool = False) -> None:
        self.calls += 1
        if name not in self.volumes:
            raise RuntimeError(f"get {name}: no such volume")
        if self.calls <= self.busy_for:
            raise RuntimeError(self.error)
        self.volumes.discard(name)


class FakeClock:
    """Stands in for docker_box's ``time`` module only: sleeping advances it, nothing waits."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(docker_box, "time", clock)  # not the process-wide time module
    return clock


def test_a_volume_busy_for_several_seconds_is_still_removed(no_sleep):
    api = FakeApi(busy_for=9)  # ~4 s of "in use" with the back-off
    assert docker_box.remove_volume(api, "execbox-ws-x") is True
    assert api.volumes == set() and api.calls == 10
    assert 1.0 < no_sleep.now < docker_box.VOLUME_PATIENCE


def test_a_volume_already_gone_counts_as_removed():
    api = FakeApi(busy_for=0)
    api.volumes.clear()
    assert docker_box.remove_volume(api, "execbox-ws-x") is True and api.calls == 1


def test_a_volume_never_freed_is_given_up_after_the_patience_and_logged(no_sleep, caplog):
    api = FakeApi(busy_for=10**6)
    assert docker_box.remove_volume(api, "execbox-ws-x", patience=5.0) is False
    assert no_sleep.now <= 5.0 and "execbox-ws-x" in caplog.text and "in use" in caplog.text
