"""Taking over a session whose owner died with its workspace still bound (a replica killed, frozen
or cut off on a shared host): the new box never looks through that mount. What a tenant made
there (a symlink named like the workspace image, an image of its own, a link to a host directory)
is never mounted or followed by root; a dead owner's box is reaped first, and its files are kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from execbox.boxes import loopdev, quota
from execbox.errors import InstanceCreationError

from .conftest import cgroups_ready, jail_ready, make_provider, run, wait_for

pytestmark = pytest.mark.jail


def _ext4_with_link_to(image: str, target: str) -> None:
    """A tenant-made ext4 image holding ``payload -> target`` (what root would follow)."""
    quota._mkfs(image, 8 << 20)
    mnt = image + ".mnt"
    os.makedirs(mnt)
    quota.mount_image(image, mnt)
    try:
        os.symlink(target, os.path.join(mnt, "payload"))
    finally:
        quota.unmount(mnt)
        quota.detach(image)
        os.rmdir(mnt)


@pytest.fixture
def jail():
    jail_ready()
    if os.geteuid() != 0:
        pytest.skip("workspace images need root (loop mounts); without root the caller dir is bound as is")
    p = make_provider()
    yield p
    p.shutdown()


def test_a_workspace_still_mounted_is_never_looked_through(jail, tmp_path):
    ws, host_dir = tmp_path / "ws", tmp_path / "root-only"
    ws.mkdir()
    host_dir.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tenant-fs", str(ws)], check=True)
    try:  # what a stale bind shows: the tenant's own files, arranged to look like our image
        (ws / "sub").mkdir()
        (ws / "data.txt").write_text("tenant")
        _ext4_with_link_to(str(ws / "sub" / "evil.img"), str(host_dir))
        os.symlink("sub/evil.img", ws / quota.PERSISTENT_IMAGE)
        with pytest.raises(InstanceCreationError) as e:
            jail.create_instance(session_id="s", workspace=str(ws))
        assert "still mounted" in e.value.message and str(tmp_path) not in e.value.message
        assert loopdev.backing_devices(str(ws / "sub" / "evil.img")) == []  # never mounted
        assert sorted(os.listdir(ws)) == [quota.PERSISTENT_IMAGE, "data.txt", "sub"]  # nothing made or moved
        assert os.listdir(host_dir) == []
    finally:
        quota.unmount(str(ws))


def test_a_workspace_image_that_is_not_our_file_is_refused(jail, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    _ext4_with_link_to(str(tmp_path / "other.img"), str(tmp_path))
    os.symlink(tmp_path / "other.img", ws / quota.PERSISTENT_IMAGE)
    with pytest.raises(InstanceCreationError) as e:
        jail.create_instance(session_id="s", workspace=str(ws))
    assert "not a regular file" in e.value.message
    assert loopdev.backing_devices(str(tmp_path / "other.img")) == []


OWNER = r"""
import json, sys, time
from execbox.providers.jail import JailProvider
p = JailProvider(); p.initialize({"pool_size": 0, "disk_quota_mb": 16, "preload": "none"})
inst = p.create_instance(session_id="s", workspace=sys.argv[1])
p.execute_code(inst.instance_id, "open('kept.txt', 'w').write('from the old owner')", "python", 10)
print(json.dumps({"name": p._instances[inst.instance_id].box.name}), flush=True)
time.sleep(600)
"""


def test_a_dead_owners_box_is_reaped_at_takeover_and_its_files_are_kept(jail, tmp_path):
    cgroups_ready()
    ws = tmp_path / "ws"
    ws.mkdir()
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(ws)], stdout=subprocess.PIPE, text=True)
    try:
        json.loads(owner.stdout.readline())
    finally:
        owner.send_signal(signal.SIGKILL)  # dies with the workspace still bound on ws
        owner.wait()
    assert wait_for(lambda: quota.is_mounted(str(ws)), timeout=5)
    inst = jail.create_instance(session_id="s", workspace=str(ws))
    try:
        r = run(jail, inst.instance_id, "import os; print(sorted(os.listdir('.')), open('kept.txt').read())")
        assert r.stdout == "['artifacts', 'kept.txt'] from the old owner\n", r  # no image inside the image
    finally:
        jail.destroy_instance(inst.instance_id)


def test_files_beside_an_existing_image_never_move_through_its_links(jail, tmp_path):
    """A name the image already holds (here a tenant's link to a host directory) is not a place
    to move a stray file beside the image into: root would have followed the link."""
    ws, host_dir = tmp_path / "ws", tmp_path / "root-only"
    ws.mkdir()
    host_dir.mkdir(mode=0o700)
    inst = jail.create_instance(session_id="s", workspace=str(ws))
    run(jail, inst.instance_id, f"import os; os.symlink({str(host_dir)!r}, 'notes')")
    jail.destroy_instance(inst.instance_id)
    assert wait_for(lambda: not quota.is_mounted(str(ws)), timeout=10)
    (ws / "notes").write_text("a stray file beside the image")
    inst = jail.create_instance(session_id="s", workspace=str(ws))
    try:
        assert os.listdir(host_dir) == []
        r = run(jail, inst.instance_id, "import os; print(os.readlink('notes'))")
        assert r.stdout.strip() == str(host_dir)  # the image's own entry, untouched
    finally:
        jail.destroy_instance(inst.instance_id)
    assert wait_for(lambda: not quota.is_mounted(str(ws)), timeout=10)
    assert (ws / "notes").read_text() == "a stray file beside the image"  # left where it was, not lost


def test_a_box_start_failure_does_not_show_host_paths_to_the_tenant(jail, tmp_path, monkeypatch):
    secret_path = "/var/lib/execbox/boxes/jail-4242-1-abcdef/workspace"

    def broken(*a, **kw):
        raise FileNotFoundError(2, "No such file or directory", secret_path)

    monkeypatch.setattr(jail, "start_box", broken)
    with pytest.raises(InstanceCreationError) as e:
        jail.create_instance(session_id="s", workspace=str(tmp_path / "ws"))
    assert "No such file or directory" in e.value.message and "/var/lib" not in e.value.message
