"""What runs inside a docker box: languages, arguments, artifacts, files, timeout, OOM, pids."""

from __future__ import annotations

import os

import pytest

from execbox.errors import InvalidConfigError

pytestmark = pytest.mark.docker


def test_python_main_with_arguments(provider, instance):
    r = provider.execute_code(instance, "def main(a, b):\n    print('hi')\n    return {'sum': a + b}\n",
                              "python", arguments={"a": 2, "b": 3})
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "hi\n"
    assert r.result == {"sum": 5}
    assert r.metadata["isolation"] == ("gvisor" if provider.runtime == "runsc" else "container")


def test_javascript_and_bash(provider, instance):
    r = provider.execute_code(instance, "function main(args) { return args.x * 2 }", "javascript",
                              arguments={"x": 21})
    assert r.exit_code == 0, r.stderr
    assert r.result == 42
    r = provider.execute_code(instance, "echo \"$((6*7))\"; echo oops >&2; exit 3", "bash")
    assert (r.stdout, r.stderr.strip(), r.exit_code) == ("42\n", "oops", 3)


def test_session_state_and_files(provider, instance):
    provider.write_file(instance, "data/in.txt", "alpha\nbeta\n")
    r = provider.execute_code(instance, "print(open('data/in.txt').read().upper(), end='')", "python")
    assert r.stdout == "ALPHA\nBETA\n"
    assert provider.read_file(instance, "data/in.txt", offset=1, limit=1).content.strip() == "beta"
    assert "data/in.txt" in provider.glob(instance, "**/*.txt")
    assert [m.line_number for m in provider.grep(instance, "beta")] == [2]
    names = {f.path for f in provider.list_files(instance, ".", recursive=True)}
    assert "data/in.txt" in names
    with pytest.raises(InvalidConfigError) as ei:
        provider.read_file(instance, "../etc/passwd")
    assert ei.value.code == "SB002" and ".." in ei.value.message
    with pytest.raises(InvalidConfigError) as ei:
        provider.read_file(instance, "missing.txt")
    assert ei.value.http_status == 404


def test_home_user_is_the_workspace(provider, instance):
    """E2B programs write to /home/user: the image links it to /workspace (boxes/images.HOME_ALIAS)."""
    provider.write_file(instance, "home.txt", "hi")
    r = provider.execute_code(instance, "cat /home/user/home.txt; echo; cd /home/user && pwd -P && echo made > q.txt",
                              "bash")
    assert (r.exit_code, r.stdout) == (0, "hi\n/workspace\n"), r
    assert provider.read_file(instance, "q.txt").content == "made\n"


def test_artifacts_and_figures(provider, instance):
    code = ("import matplotlib.pyplot as plt\n"
            "open('artifacts/report.csv', 'w').write('a,b\\n1,2\\n')\n"
            "plt.plot([1, 2, 3]); plt.title('t')\n")
    r = provider.execute_code(instance, code, "python")
    assert r.exit_code == 0, r.stderr
    by_name = {a.name: a for a in r.artifacts}
    assert by_name["report.csv"].read_bytes() == b"a,b\n1,2\n"
    pngs = [a for a in r.artifacts if a.mime_type == "image/png"]
    assert pngs and pngs[0].read_bytes().startswith(b"\x89PNG")


def test_timeout_kills_and_box_survives(provider, instance):
    r = provider.execute_code(instance, "import time\nwhile True: time.sleep(0.01)", "python", timeout=1)
    assert r.timed_out and r.error_code == "SB005"
    assert provider.execute_code(instance, "print('still here')", "python").stdout == "still here\n"


OOM_REPEAT = int(os.environ.get("EXECBOX_OOM_REPEAT", "1"))
"""EXECBOX_OOM_REPEAT=20 repeats the memory bomb (issue 19: SB006 twenty times in a row under runsc)."""


@pytest.mark.parametrize("attempt", range(OOM_REPEAT))
def test_memory_bomb_is_sb006(provider, attempt):
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))\n"
    instance = provider.create_instance(tenant_id="t1", session_id=f"oom{attempt}").instance_id
    try:
        r = provider.execute_code(instance, code, "python", timeout=30)
        code_seen = r.error_code
    except Exception as e:  # the cgroup OOM killer may take the whole box down instead
        code_seen = getattr(e, "code", repr(e))
    finally:
        try:
            provider.destroy_instance(instance)
        except Exception:  # noqa: BLE001 - a box the OOM took down is already gone
            pass
    assert code_seen == "SB006"


def test_pids_limit_contains_fork_bomb(provider, instance):
    r = provider.execute_code(instance, "for i in $(seq 1 200); do sleep 3 & done 2>&1; wait; echo done",
                              "bash", timeout=20)
    assert "Resource temporarily unavailable" in r.stdout + r.stderr
    assert provider.execute_code(instance, "print(1)", "python").stdout == "1\n"


def test_instances_do_not_see_each_other(provider):
    a = provider.create_instance(tenant_id="ta", session_id="sa").instance_id
    b = provider.create_instance(tenant_id="tb", session_id="sb").instance_id
    try:
        provider.write_file(a, "secret.txt", "tenant a only")
        assert "secret.txt" not in {f.path for f in provider.list_files(b, ".", recursive=True)}
        r = provider.execute_code(b, "find / -name secret.txt 2>/dev/null | head", "bash")
        assert r.stdout == ""
    finally:
        provider.destroy_instance(a)
        provider.destroy_instance(b)


def test_cgroup_oom_kill_is_sb006(provider, instance):
    """Off-heap memory (Buffers) escapes node's heap limit: the container's cgroup stops it."""
    code = "const a = []; while (true) { a.push(Buffer.alloc(16 * 1024 * 1024, 1)); }"
    try:
        r = provider.execute_code(instance, code, "javascript", timeout=60)
        code_seen = r.error_code
    except Exception as e:  # under gVisor the OOM killer may take the whole sandbox
        code_seen = getattr(e, "code", repr(e))
    assert code_seen == "SB006"


def test_first_pooled_run_is_warm_and_runs_stay_fresh(provider):
    inst = provider.create_instance(tenant_id="t", session_id=None).instance_id
    try:
        r = provider.execute_code(inst, "x = 41\ndef main(y):\n    return x + y\n", "python", arguments={"y": 1})
        assert r.result == 42 and r.metadata.get("warm_start") is True
        assert "context_id" not in r.metadata
        r = provider.execute_code(inst, "print('x' in globals())", "python")
        assert r.stdout == "False\n" and "warm_start" not in r.metadata
    finally:
        provider.destroy_instance(inst)


def test_named_context_keeps_globals(provider, instance):
    provider.execute_code(instance, "x = 5", "python", context_id="nb")
    r = provider.execute_code(instance, "print(x)", "python", context_id="nb")
    assert r.stdout == "5\n" and r.metadata["context_id"] == "nb"
    assert r.metadata["context_executions"] == 2


def test_session_spare_serves_one_run_and_is_released(provider):
    import time

    inst = provider.create_instance(tenant_id="t", session_id="spare").instance_id
    box = provider._instances[inst].box
    try:
        seen = []
        for i in range(3):
            r = provider.execute_code(inst, f"print('y' in globals()); y = {i}", "python")
            assert r.stdout == "False\n", r.stderr
            seen.append(r.metadata.get("warm_start"))
        assert seen == [True, None, None]
        deadline = time.monotonic() + 30
        while box.client.call("ping")["contexts"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert box.client.call("ping")["contexts"] == []  # the used spare does not linger
    finally:
        provider.destroy_instance(inst)


def test_named_context_survives_the_spare_release(provider):
    import time

    inst = provider.create_instance(tenant_id="t", session_id="mix").instance_id
    box = provider._instances[inst].box
    try:
        provider.execute_code(inst, "x = 7", "python", context_id="nb")
        provider.execute_code(inst, "print(0)", "python")  # uses the spare, which is then reset
        deadline = time.monotonic() + 30
        while len(box.client.call("ping")["contexts"]) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert box.client.call("ping")["contexts"] == ["nb"]
        r = provider.execute_code(inst, "print(x)", "python", context_id="nb")
        assert r.stdout == "7\n", r.stderr
    finally:
        provider.destroy_instance(inst)
