"""A runc box shares the host kernel's /proc and /sys: from one, ``/sys/block/loop*/loop/backing_file``
named every other box's workspace image (``<workspaces>/<tenant>/<session>/.execbox-workspace.img``:
each live session's tenant and session id) and /proc/diskstats gave every loop device's I/O counters.
runc boxes now mask the host's block-device views on top of Docker's own masked paths
(boxes/docker_masks.py); runsc boxes have the sentry's /proc and /sys, where none of them exist."""

from __future__ import annotations

import glob
import json
import os
import secrets

import pytest

from execbox.boxes import docker_masks
from tests.conftest import require

pytestmark = pytest.mark.docker

SPY = r"""
import glob, json, os
out = {"backing": {}, "listed": {}, "loop_lines": {}}
for pattern in ("/sys/block/*/loop/backing_file", "/sys/class/block/*/loop/backing_file",
                "/sys/devices/virtual/block/*/loop/backing_file", "/sys/dev/block/*/loop/backing_file"):
    for path in glob.glob(pattern):
        try:
            out["backing"][path] = open(path).read().strip()
        except OSError as e:
            out["backing"][path] = f"error {e.errno}"
for name in ("/proc/diskstats", "/proc/partitions"):
    try:
        out["loop_lines"][name] = [line.strip() for line in open(name) if " loop" in line]
    except OSError as e:
        out["loop_lines"][name] = f"error {e.errno}"
for name in ("/sys/block", "/sys/class/block", "/sys/devices/virtual/block", "/sys/fs/ext4", "/proc/fs/ext4",
             "/proc/fs/jbd2", "/sys/class/bdi", "/sys/devices/virtual/bdi"):
    try:  # loop devices by name, and their backing-device entries by major number (7:N)
        out["listed"][name] = [n for n in os.listdir(name) if n.startswith(("loop", "7:"))]
    except OSError as e:
        out["listed"][name] = f"error {e.errno}"
print(json.dumps(out))
"""


def _host_backing_files() -> list[str]:
    found = []
    for path in glob.glob("/sys/block/loop*/loop/backing_file"):
        try:
            with open(path) as f:
                found.append(f.read().strip())
        except OSError:
            pass
    return found


def test_a_box_learns_nothing_of_another_tenant_s_workspace_image(provider, tmp_path):
    session = f"q3-acquisition-of-initech-{secrets.token_hex(4)}"
    ws = tmp_path / "acme-corp" / session
    victim = provider.create_instance(tenant_id="acme-corp", session_id=session, workspace=str(ws)).instance_id
    spy = provider.create_instance(tenant_id="mallory", session_id="spy").instance_id
    try:
        r = provider.execute_code(victim, "open('plan.txt', 'w').write('x' * 1_000_000)\nimport os\nos.sync()",
                                  "python")
        assert r.exit_code == 0, r.stderr
        # the attack needs the victim's workspace on a loop image (root with loop devices)
        require(any(session in f for f in _host_backing_files()), "a loop-backed session workspace (root)")
        r = provider.execute_code(spy, SPY, "python")
        assert r.exit_code == 0, r.stderr
        assert session not in r.stdout and "acme-corp" not in r.stdout, r.stdout
        out = json.loads(r.stdout)
        assert out["backing"] == {}, out["backing"]
        for name, lines in out["loop_lines"].items():  # masked (empty) under runc, absent under runsc
            assert lines in ([], "error 2"), (name, lines)
        for name, listed in out["listed"].items():
            assert listed in ([], "error 2"), (name, listed)
    finally:
        provider.destroy_instance(spy)
        provider.destroy_instance(victim)


def test_the_box_keeps_docker_s_own_masks_and_still_works(provider, instance, docker_engine):
    """MaskedPaths replaces the daemon's list: a runc box's must hold all of it."""
    box = provider._instances[instance].box
    masked = docker_engine.api.inspect_container(box.container_id)["HostConfig"].get("MaskedPaths") or []
    probe = docker_engine.api.create_container(provider.config["image"], command=["/bin/true"],
                                               host_config=docker_engine.api.create_host_config(network_mode="none"))
    try:
        defaults = docker_engine.api.inspect_container(probe["Id"])["HostConfig"].get("MaskedPaths") or []
    finally:
        docker_engine.api.remove_container(probe["Id"], force=True)
    assert defaults and set(defaults) <= set(masked), (defaults, masked)
    if provider.runtime == "runc":
        assert set(docker_masks.BLOCK_VIEWS) <= set(masked), masked
    else:  # gVisor: the daemon's own list, untouched
        assert masked == defaults
    r = provider.execute_code(instance, "import os, platform\nprint(os.cpu_count() > 0, platform.system(),"
                              " len(open('/proc/meminfo').read()) > 0)", "python")
    assert r.stdout.split() == ["True", "Linux", "True"], r.stderr
    r = provider.execute_code(instance, "node -e 'const os = require(\"os\"); console.log(os.cpus().length > 0, "
                              "os.totalmem() > 0)' && df -P /workspace | tail -1 | wc -l", "bash")
    assert r.exit_code == 0 and r.stdout.split() == ["true", "true", "1"], (r.stdout, r.stderr)
    if os.path.exists("/proc/diskstats") and provider.runtime == "runc":
        r = provider.execute_code(instance, "print(repr(open('/proc/diskstats').read()))", "python")
        assert r.stdout.strip() == "''", r.stdout  # masked: /dev/null
