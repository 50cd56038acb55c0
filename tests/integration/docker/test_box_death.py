"""Boxes killed from outside at awkward moments (review 40, findings 2 and 3): in the middle of a
large upload, and while they wait in the warm pool."""

from __future__ import annotations

import threading
import time

import pytest

from execbox.errors import ProviderUnavailableError

pytestmark = pytest.mark.docker


def _wait(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _stopped(engine, container_id: str) -> bool:
    return not engine.api.inspect_container(container_id)["State"]["Running"]


@pytest.mark.parametrize("provider", ["runc"], indirect=True)  # runc only: see below
def test_a_box_killed_mid_upload_fails_the_write_at_once(provider, docker_engine):
    """The write used to hang 78-108 s in a blocking send (dockerd stops draining a dead
    container's stdin long before it drops the connection), holding the box's write lock.

    The container is paused first, so the upload is surely in flight (stalled) when it is killed.
    runc only: killing a paused runsc container takes the engine ~10 s, and the stream handling
    under test is the same for both runtimes."""
    inst = provider.create_instance(tenant_id="t", session_id="upload-kill")
    box = provider._instances[inst.instance_id].box
    provider.write_file(inst.instance_id, "big.bin", b"old")
    res: dict = {}

    def upload() -> None:
        try:
            provider.write_file(inst.instance_id, "big.bin", b"\x01" * (16 << 20))
            res["ok"] = True
        except BaseException as e:  # noqa: BLE001
            res["error"] = e
        res["done"] = time.monotonic()

    th = threading.Thread(target=upload, daemon=True)
    try:
        docker_engine.api.pause(box.container_id)
        th.start()
        time.sleep(0.5)
        assert th.is_alive()  # stalled: the agent is frozen
        docker_engine.api.kill(box.container_id)
        killed = time.monotonic()
        th.join(30)
        assert not th.is_alive(), "the write still hangs 30 s after its container was killed"
        assert isinstance(res.get("error"), ProviderUnavailableError), res
        assert res["done"] - killed < 10, f"the write answered {res['done'] - killed:.1f}s after the kill"
        assert not provider.instance_alive(inst.instance_id)
    finally:
        provider.destroy_instance(inst.instance_id)
        th.join(120)


def test_pool_boxes_killed_while_idle_are_not_handed_out(provider, docker_engine):
    """``alive()`` looked only at a flag set by a failed read or write, and a pooled box is never
    read while it waits: each dead one cost a caller an SB009."""
    assert _wait(lambda: provider.pool_status()["ready"] == 2, 120)
    pooled = list(provider._pool._ready)
    for box in pooled:
        docker_engine.api.kill(box.container_id)
    assert _wait(lambda: all(_stopped(docker_engine, b.container_id) for b in pooled), 30)
    time.sleep(0.3)  # the engine closes their attach streams
    for i in range(2):
        inst = provider.create_instance(tenant_id="t", session_id=None)
        try:
            assert provider._instances[inst.instance_id].box not in pooled
            assert provider.execute_code(inst.instance_id, f"print({i})", "python").stdout == f"{i}\n"
        finally:
            provider.destroy_instance(inst.instance_id)
