"""The jail provider end to end with real bubblewrap: runs, sessions, limits, pool, cleanup."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from execbox.boxes.jail_box import drain
from execbox.errors import InvalidConfigError, ProviderUnavailableError
from execbox.providers.jail import JailProvider

from .conftest import assert_healthy, cgroups_ready, make_provider, run, wait_for

pytestmark = pytest.mark.jail


def test_availability_and_diagnose_are_honest(jail):
    ok, reason = JailProvider.availability()
    assert ok and reason.startswith("ok")
    checks = JailProvider.diagnose()
    assert {"bwrap", "seccomp", "user_namespaces", "cgroups", "workspace_quota", "trial_box"} <= set(checks)
    assert checks["trial_box"]["ok"], checks["trial_box"]
    assert all(isinstance(c["detail"], str) and c["detail"] for c in checks.values())


def test_a_context_traceback_shows_an_earlier_cells_lines(jail, box):
    """The jail's agent starts lean (no linecache until a traceback needs it): every cell's source
    waits for that import, not only the last one's."""
    assert run(jail, box, "def g():\n    return 1 / 0", context_id="tb").exit_code == 0
    r = run(jail, box, "a = 1\ng()", context_id="tb")
    assert '  File "<cell 1>", line 2, in g\n    return 1 / 0\n' in r.stderr, r.stderr


def test_python_javascript_bash_run_in_the_box(jail, box, node_available):
    r = run(jail, box, "def main(a, b):\n    return {'sum': a + b}\n", arguments={"a": 2, "b": 3})
    assert r.exit_code == 0 and r.result == {"sum": 5}
    assert r.metadata["isolation"] == "jail" and r.metadata["limits"]["network"] == "none"
    r = run(jail, box, "echo hi from $(id -un) $(id -u)", "bash")
    assert r.stdout == "hi from sandbox 1000\n"
    if node_available:
        r = run(jail, box, "console.log([1, 2, 3].map(x => x * 2).join(','))", "javascript")
        assert (r.exit_code, r.stdout) == (0, "2,4,6\n"), r.stderr


def test_environment_is_built_from_scratch(jail, box, monkeypatch):
    monkeypatch.setenv("EXECBOX_TEST_SECRET", "s3cr3t-value")  # the service's env must not leak in
    r = run(jail, box, "import os, json; print(json.dumps(dict(os.environ)))")
    env = __import__("json").loads(r.stdout)
    assert "EXECBOX_TEST_SECRET" not in env and "s3cr3t-value" not in r.stdout
    assert env["HOME"] == "/workspace" and env["USER"] == "sandbox"
    assert not any(k.startswith(("PYTHON", "VIRTUAL_ENV", "PYENV")) and k not in ("PYTHONDONTWRITEBYTECODE",
                                                                                "PYTHONPATH") for k in env)
    assert env["PYTHONPATH"] == "/workspace/.execbox/python"  # in-session installs only (docs/network.md)


def test_box_runs_the_host_system_python_not_execbox_venv(jail, box):
    r = run(jail, box, "import sys, os; print(sys.executable); print(sys.prefix); "
                       "print(os.path.exists('/work'), os.path.exists('/root'))")
    exe, prefix, seen = r.stdout.splitlines()
    assert exe == "/usr/bin/python3" and prefix == "/usr"
    assert seen == "False False"


def test_session_keeps_files_and_context_state(jail, box):
    jail.write_file(box, "data/in.txt", "hello")
    r = run(jail, box, "open('data/out.txt','w').write(open('data/in.txt').read().upper())")
    assert r.exit_code == 0
    assert jail.read_file(box, "data/out.txt").content.startswith("HELLO")
    assert run(jail, box, "x = 41", context_id="c1").exit_code == 0
    assert run(jail, box, "print(x + 1)", context_id="c1").stdout == "42\n"


def test_files_written_by_the_box_are_readable_through_the_file_api(jail, box):
    run(jail, box, "import os; os.makedirs('out', exist_ok=True); open('out/r.bin','wb').write(bytes(range(256)))")
    assert jail.read_bytes(box, "out/r.bin") == bytes(range(256))
    names = [f.path for f in jail.list_files(box, "out")]
    assert any(n.endswith("r.bin") for n in names)


def test_timeout_is_sb005_and_the_box_keeps_working(jail, box):
    r = run(jail, box, "import time\nwhile True: time.sleep(0.1)", timeout=1)
    assert r.timed_out and r.metadata["error_code"] == "SB005"
    assert_healthy(jail, box)


def test_cpu_limit_is_applied_to_the_cgroup(jail, box):
    cgroups_ready()
    inst = jail._instances[box]
    cg = inst.box.cgroup
    assert cg is not None
    if cg.layout.version == 1:
        quota = int(open(os.path.join(cg.dirs["cpu"], "cpu.cfs_quota_us")).read())
        assert quota == 100_000
        assert int(open(os.path.join(cg.dirs["pids"], "pids.max")).read()) == 64
        assert int(open(os.path.join(cg.dirs["memory"], "memory.limit_in_bytes")).read()) == 256 * 1024**2
        parent_shares = int(open(os.path.join(os.path.dirname(cg.dirs["cpu"]), "cpu.shares")).read())
        assert parent_shares == 1024 * (os.cpu_count() or 1)  # boxes together weigh one process per CPU
    else:
        assert open(os.path.join(cg.dirs[""], "cpu.max")).read().split()[0] == "100000"


def test_destroy_removes_cgroup_workspace_and_processes(jail):
    cgroups_ready()
    inst = jail.create_instance()
    b = jail._instances[inst.instance_id].box
    r = run(jail, inst.instance_id, "import subprocess; subprocess.Popen(['sleep', '1000']); print('ok')")
    assert r.stdout == "ok\n"
    pids = b.cgroup.pids()
    assert pids
    ws, box_dir, cgdirs = b.workspace, b.box_dir, list(b.cgroup.dirs.values())
    assert jail.destroy_instance(inst.instance_id)
    assert wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids))
    assert drain()  # unmounting and rmdir happen off the caller's clock
    assert not any(os.path.isdir(d) for d in cgdirs)
    assert not os.path.exists(box_dir) and not (ws and os.path.ismount(ws))


def test_caller_workspace_has_a_quota_and_survives_its_box(jail, tmp_path):
    ws = tmp_path / "session-ws"
    ws.mkdir()
    (ws / "seed.txt").write_text("from host")
    inst = jail.create_instance(session_id="s1", workspace=str(ws))
    r = run(jail, inst.instance_id, "print(open('seed.txt').read()); open('made.txt','w').write('by box')")
    assert r.stdout == "from host\n"
    assert (ws / "made.txt").read_text() == "by box"  # the host sees the files in place
    r = run(jail, inst.instance_id, "import os\ntry:\n    for n in ('b1', 'b2'):\n"
                                    "        open(n, 'wb').write(os.urandom(20 << 20))\n"
                                    "except OSError as e:\n    print(e.strerror)\nos.remove('b1')")
    assert r.stdout.strip() == "No space left on device"  # 32 MB quota
    jail.destroy_instance(inst.instance_id)
    # a new box for the same session finds everything (kept in the session's workspace image)
    again = jail.create_instance(session_id="s1", workspace=str(ws))
    r = run(jail, again.instance_id, "import os; print(sorted(os.listdir('.')))")
    assert "made.txt" in r.stdout and "seed.txt" in r.stdout
    jail.destroy_instance(again.instance_id)
    assert drain()
    assert ws.is_dir() and [p.name for p in ws.iterdir()] == [".execbox-workspace.img"]


def _cpu_weight(box) -> int:
    """The box cgroup's CPU weight as the kernel holds it (v1 cpu.shares or v2 cpu.weight)."""
    cg = box.cgroup
    path = os.path.join(cg.dirs["cpu"], "cpu.shares") if cg.layout.version == 1 else \
        os.path.join(cg.dirs[""], "cpu.weight")
    return int(Path(path).read_text())


def test_pool_refills_start_at_low_cpu_weight_and_serve_at_the_normal_one():
    """A refill's start-up yields the CPU to boxes serving runs; a handed-out box gets it back."""
    from execbox.boxes import cgroups

    p = make_provider(pool_size=1)
    try:
        assert wait_for(lambda: p.pool_status()["ready"] == 1, timeout=30)
        pooled = p._pool._ready[0]
        if pooled.cgroup is None:
            pytest.skip("boxes run without cgroups on this host")
        low, normal = (cgroups.BACKGROUND_SHARES, 1024) if pooled.cgroup.layout.version == 1 \
            else (cgroups.BACKGROUND_WEIGHT, 100)
        assert _cpu_weight(pooled) == low
        a = p.create_instance()
        assert a.metadata["from_pool"] is True and p._get(a.instance_id).box is pooled
        assert _cpu_weight(pooled) == normal
        direct = p.start_box()  # what create_instance starts when the pool is empty
        try:
            assert _cpu_weight(direct) == normal
        finally:
            direct.destroy()
        p.destroy_instance(a.instance_id)
    finally:
        p.shutdown()


def test_warm_pool_hands_each_box_out_once_and_refills():
    p = make_provider(pool_size=1)
    try:
        assert wait_for(lambda: p.pool_status()["ready"] == 1, timeout=30)
        a = p.create_instance()
        assert a.metadata["from_pool"] is True
        assert run(p, a.instance_id, "open('mark','w').write('a')").exit_code == 0
        assert wait_for(lambda: p.pool_status()["ready"] == 1, timeout=30)
        b = p.create_instance()
        assert b.metadata["from_pool"] is True and b.metadata["box"] != a.metadata["box"]
        r = run(p, b.instance_id, "import os; print(os.path.exists('mark'))")
        assert r.stdout == "False\n"  # never a box another instance used
        p.destroy_instance(a.instance_id)
        p.destroy_instance(b.instance_id)
        status = p.pool_status()
        assert status["healthy"] and status["failures"] == 0 and status["handed_out"] == 2
    finally:
        p.shutdown()


def test_new_session_takes_a_warm_box_and_keeps_its_workspace(tmp_path):
    """A new session's empty workspace adopts a pooled box's image: no cold start, same persistence."""
    from execbox.boxes.jail_box import boxes_dir

    p = make_provider(pool_size=1, pool_sessions=True)
    ws = tmp_path / "sess"
    if os.stat(tmp_path).st_dev != os.stat(os.path.dirname(boxes_dir())).st_dev:  # adoption needs one fs
        ws = Path(tempfile.mkdtemp(prefix="execbox-adopt-", dir=os.path.dirname(boxes_dir()))) / "sess"
    try:
        assert wait_for(lambda: p.pool_status()["ready"] == 1, timeout=30)
        a = p.create_instance(session_id="s1", workspace=str(ws))
        assert a.metadata["from_pool"] is True and a.metadata["workspace"] == str(ws)
        assert run(p, a.instance_id, "open('made.txt', 'w').write('kept')").exit_code == 0
        assert (ws / "made.txt").read_text() == "kept"  # the host sees the files in place
        p.destroy_instance(a.instance_id)
        assert drain()
        assert [x.name for x in ws.iterdir()] == [".execbox-workspace.img"]
        assert wait_for(lambda: p.pool_status()["ready"] == 1, timeout=30)
        again = p.create_instance(session_id="s1", workspace=str(ws))  # not empty: a cold box mounts the image
        assert again.metadata["from_pool"] is False
        assert run(p, again.instance_id, "print(open('made.txt').read())").stdout == "kept\n"
        p.destroy_instance(again.instance_id)
        assert drain()
    finally:
        p.shutdown()
        if ws.parent != tmp_path:
            shutil.rmtree(ws.parent, ignore_errors=True)


def test_pool_failures_are_visible():
    from execbox.boxes.pool import BoxPool

    p = make_provider(pool_size=0)
    try:
        # every start fails: the configured runtime is looked up at each start, and it is gone
        p._runtime_ref = "no-such-runtime-zz"
        p._pool = BoxPool(p.start_box, 1, name="jail")
        assert wait_for(lambda: p.pool_status()["failures"] >= 1, timeout=30)
        status = p.pool_status()
        assert status["healthy"] is False and "no-such-runtime-zz" in status["last_error"]
    finally:
        p.shutdown()


def test_bad_config_is_sb002_naming_the_field():
    jail_provider = JailProvider()
    with pytest.raises(InvalidConfigError) as e:
        jail_provider.initialize({"max_memory": "lots"})
    assert e.value.code == "SB002" and "max_memory" in e.value.message
    with pytest.raises(InvalidConfigError) as e:
        jail_provider.initialize({"runtime": "not-installed-xyz"})
    assert "not-installed-xyz" in e.value.message and "execbox runtime build" in e.value.message
    with pytest.raises(InvalidConfigError) as e:
        jail_provider.initialize({"pids_limit": 1})
    assert "pids_limit" in e.value.details["fields"]


def test_bad_host_uid_env_is_sb002(monkeypatch):
    from execbox.boxes.jail_box import host_uid

    for bad in ("0", "abc", "-5"):
        monkeypatch.setenv("EXECBOX_JAIL_HOST_UID", bad)
        with pytest.raises(InvalidConfigError) as e:
            host_uid()
        assert "EXECBOX_JAIL_HOST_UID" in e.value.message
    monkeypatch.setenv("EXECBOX_JAIL_HOST_UID", "61005")
    assert host_uid() == 61005


def test_zero_config_picks_jail_here():
    from execbox.providers.registry import strongest_available

    name, reasons = strongest_available(["jail", "local"])
    assert name == "jail", reasons


def test_a_dead_box_is_sb009(jail):
    cgroups_ready()
    inst = jail.create_instance()
    b = jail._instances[inst.instance_id].box
    b.cgroup.kill_all()
    with pytest.raises(ProviderUnavailableError) as e:
        run(jail, inst.instance_id, "print(1)")
    assert e.value.code == "SB009"
    jail.destroy_instance(inst.instance_id)
