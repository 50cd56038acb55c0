"""Attack tests: each tries to break out of a real jail box and asserts the specific contained
outcome, then checks that a normal run still works."""

from __future__ import annotations

import json
import os
import platform
import socket

import pytest

from execbox.boxes.jail_box import drain
from execbox.errors import InvalidConfigError, OutOfMemoryError
from tests.integration.jail.conftest import assert_healthy, cgroups_ready, pids_alive, run, wait_for

pytestmark = pytest.mark.jail

CONNECT = """
import socket, errno, json
s = socket.socket(); s.settimeout(3)
try:
    s.connect(({host!r}, {port}))
    print(json.dumps({{"connected": True, "data": s.recv(64).decode()}}))
except OSError as e:
    print(json.dumps({{"connected": False, "errno": errno.errorcode.get(e.errno, str(e))}}))
"""


# -- network -------------------------------------------------------------------------------------

def test_tcp_to_a_host_outside_the_box_is_unreachable(jail, box, netns_host):
    host, port = netns_host
    out = json.loads(run(jail, box, CONNECT.format(host=host, port=port)).stdout)
    assert out == {"connected": False, "errno": "ENETUNREACH"}
    assert_healthy(jail, box)


def test_host_loopback_server_is_not_reachable(jail, box, loopback_listener):
    port = loopback_listener.getsockname()[1]
    out = json.loads(run(jail, box, CONNECT.format(host="127.0.0.1", port=port)).stdout)
    assert out == {"connected": False, "errno": "ECONNREFUSED"}  # the box's own, empty loopback
    with pytest.raises(socket.timeout):
        loopback_listener.accept()  # nothing from the box arrived at the host's listener
    assert_healthy(jail, box)


def test_dns_does_not_work_and_only_loopback_exists(jail, box, netns_host):
    host, _ = netns_host
    code = f"""
import socket, json, errno
res = {{"ifaces": [n for _, n in socket.if_nameindex()]}}
try:
    socket.getaddrinfo("pypi.org", 443)
    res["resolved"] = True
except socket.gaierror as e:
    res["resolved"] = False
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"\\x00" * 12, ({host!r}, 53))
    res["udp"] = "sent"
except OSError as e:
    res["udp"] = errno.errorcode[e.errno]
print(json.dumps(res))
"""
    out = json.loads(run(jail, box, code).stdout)
    assert out == {"ifaces": ["lo"], "resolved": False, "udp": "ENETUNREACH"}


# -- reading the host ----------------------------------------------------------------------------

def test_host_secrets_home_source_and_data_dirs_are_invisible(jail, box, tmp_path):
    import execbox
    from execbox.boxes.runtime import jail_dir

    src = os.path.dirname(os.path.abspath(execbox.__file__))
    secret_dir = tmp_path / "data"
    secret_dir.mkdir()
    (secret_dir / "store.sqlite").write_text("secret")
    targets = ["/etc/shadow", "/root", os.path.expanduser("~"), src, os.path.join(src, "agent", "main.py"),
               os.path.dirname(os.path.dirname(src)) + "/.venv", str(secret_dir / "store.sqlite"),
               jail_dir(), "/var/lib/execbox/runtimes", "/etc/ssh", "/proc/1/environ"]
    code = f"""
import json, os, errno
out = {{}}
for p in {targets!r}:
    try:
        with open(p, "rb") as f:
            out[p] = "READ " + f.read(40).decode("latin-1")
    except IsADirectoryError:
        out[p] = "LISTED " + ",".join(os.listdir(p)[:5])
    except OSError as e:
        out[p] = errno.errorcode.get(e.errno, str(e))
print(json.dumps(out))
"""
    out = json.loads(run(jail, box, code).stdout)
    for p in targets[:-1]:
        assert out[p] == "ENOENT", (p, out[p])
    # /proc/1 is the box's own init (bwrap), whose environment was built from scratch
    assert "READ" not in out["/proc/1/environ"] or "EXECBOX" not in out["/proc/1/environ"]
    assert_healthy(jail, box)


def test_other_boxes_disk_activity_is_not_readable(jail, box):
    """/proc/diskstats and /proc/partitions list every box's workspace loop device (diskstats with
    its I/O counters): a tenant could watch another's disk activity. Both read as empty."""
    code = "import json; print(json.dumps({p: open(p).read() for p in ('/proc/diskstats', '/proc/partitions')}))"
    assert json.loads(run(jail, box, code).stdout) == {"/proc/diskstats": "", "/proc/partitions": ""}
    assert_healthy(jail, box)


def test_host_processes_and_service_environment_are_invisible(jail, monkeypatch):
    monkeypatch.setenv("EXECBOX_ATTACK_SECRET", "tok-very-secret-1234")
    inst = jail.create_instance()
    code = """
import os, json
procs = {}
envs = ""
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            procs[p] = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\\0", b" ").decode()[:80]
            envs += open(f"/proc/{p}/environ", "rb").read().decode("latin-1")
        except OSError:
            pass
print(json.dumps({"procs": procs, "secret_seen": "tok-very-secret" in envs + str(dict(os.environ))}))
"""
    try:
        out = json.loads(run(jail, inst.instance_id, code).stdout)
        assert out["secret_seen"] is False
        cmdlines = " ".join(out["procs"].values())
        assert "pytest" not in cmdlines and "process_api" not in cmdlines
        assert str(os.getpid()) not in out["procs"] or "pytest" not in out["procs"][str(os.getpid())]
        assert len(out["procs"]) <= 6  # bwrap init, agent, the run (and its shell): nothing else
    finally:
        jail.destroy_instance(inst.instance_id)


# -- writing outside the workspace ---------------------------------------------------------------

def test_code_cannot_write_outside_workspace_and_tmp(jail, box):
    code = """
import json, errno
out = {}
for p in ["/evil", "/usr/evil", "/etc/passwd", "/opt/execbox/execbox_agent/main.py", "/proc/sys/kernel/hostname"]:
    try:
        open(p, "a").write("x")
        out[p] = "WROTE"
    except OSError as e:
        out[p] = errno.errorcode.get(e.errno, str(e))
print(json.dumps(out))
"""
    out = json.loads(run(jail, box, code).stdout)
    assert out["/evil"] == "EROFS" and out["/usr/evil"] == "EROFS"
    assert out["/etc/passwd"] in ("EROFS", "EACCES")  # not ours, on a read-only mount
    assert out["/opt/execbox/execbox_agent/main.py"] in ("EROFS", "EACCES")
    assert out["/proc/sys/kernel/hostname"] in ("EROFS", "EACCES", "EPERM")
    assert_healthy(jail, box)


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "a/../../escape.txt", "link/passwd",
                                  "link2/x", "nul\x00byte"])
def test_file_api_rejects_escaping_paths(jail, box, path):
    run(jail, box, "import os; os.symlink('/etc', 'link'); os.symlink('..', 'link2')")
    with pytest.raises(InvalidConfigError) as e:
        jail.write_file(box, path, "pwned")
    assert e.value.code == "SB002" and e.value.http_status == 400
    with pytest.raises(InvalidConfigError) as e:
        jail.read_file(box, path)
    assert e.value.code == "SB002"
    r = run(jail, box, "print(open('/etc/passwd').read().count('pwned'))")
    assert r.stdout == "0\n"
    assert_healthy(jail, box)


# -- resource exhaustion -------------------------------------------------------------------------

def test_fork_bomb_is_stopped_by_the_pids_limit(jail, box):
    cgroups_ready()
    code = """
import os, time, json
n, err = 0, None
try:
    while n < 5000:
        if os.fork() == 0:
            time.sleep(30); os._exit(0)
        n += 1
except OSError as e:
    err = e.strerror
print(json.dumps({"forked": n, "error": err}))
"""
    out = json.loads(run(jail, box, code, timeout=30).stdout)
    assert out["error"] == "Resource temporarily unavailable" and out["forked"] < 64  # pids_limit=64
    cg = jail._instances[box].box.cgroup
    r = run(jail, box, ":(){ :|:& };:; sleep 1", "bash", timeout=4)
    assert "Resource temporarily unavailable" in r.stderr or r.timed_out
    if cg.layout.version == 1:
        events = open(os.path.join(cg.dirs["pids"], "pids.events")).read().split()
        assert int(events[events.index("max") + 1]) > 0  # the pids limit was what stopped it
    assert wait_for(lambda: len(cg.pids()) <= 3, timeout=10)  # the run's tree is gone: bwrap + agent
    assert_healthy(jail, box)


def test_memory_bomb_in_python_is_sb006(jail, box):
    r = run(jail, box, "x = []\nwhile True:\n    x.append(bytearray(16 * 1024 * 1024))", timeout=30)
    assert r.metadata.get("error_code") == "SB006", (r.stderr[-300:], r.metadata)
    assert_healthy(jail, box)


def test_memory_bomb_across_processes_hits_the_cgroup_and_is_sb006(jail):
    """Each process stays under the per-process rlimit; together they exceed the box's cgroup."""
    cgroups_ready()
    inst = jail.create_instance()
    code = """
import subprocess, sys
hog = "import time; b = bytearray(110 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); time.sleep(2)"
ps = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(4)]
for p in ps:
    p.wait()
print("done")
"""
    try:
        try:
            r = run(jail, inst.instance_id, code, timeout=30)
            assert r.metadata.get("error_code") == "SB006", (r.stdout, r.stderr[-300:])
        except OutOfMemoryError as e:  # the OOM killer picked the agent itself
            assert e.code == "SB006"
        box_obj = jail._instances[inst.instance_id].box if inst.instance_id in jail._instances else None
        assert box_obj is None or box_obj.oom_events() >= 1
    finally:
        jail.destroy_instance(inst.instance_id)
    assert_healthy(jail)


def test_filling_the_disk_past_the_quota_fails_cleanly(jail, box):
    # quota 32 MB; RLIMIT_FSIZE caps one file at the quota, so fill with two files
    code = """
import errno
written = 0
try:
    for name in ("a.bin", "b.bin"):
        with open(name, "wb") as f:
            for _ in range(20):
                f.write(b"\\0" * (1 << 20)); f.flush(); written += 1
except OSError as e:
    print(errno.errorcode[e.errno], written)
"""
    r = run(jail, box, code, timeout=30)
    code_name, written = r.stdout.split()
    assert code_name in ("ENOSPC", "EDQUOT") and 20 <= int(written) < 40
    with pytest.raises(InvalidConfigError) as e:
        jail.write_file(box, "c.bin", b"\0" * (8 << 20))
    assert e.value.code == "SB002" and e.value.http_status == 507
    r = run(jail, box, "import os; os.remove('a.bin'); os.remove('b.bin'); open('ok.txt','w').write('fine')")
    assert r.exit_code == 0 and jail.read_file(box, "ok.txt").content.startswith("fine")
    assert_healthy(jail, box)


def test_tmp_and_dev_shm_are_size_capped(jail, box):
    code = """
import errno, json
out = {}
for d in ("/tmp", "/dev/shm"):
    try:
        for n in ("a", "b"):
            with open(f"{d}/{n}", "wb") as f:
                f.write(b"\\0" * (20 << 20))
        out[d] = "WROTE 40MB"
    except OSError as e:
        out[d] = errno.errorcode[e.errno]
print(json.dumps(out))
"""
    assert json.loads(run(jail, box, code).stdout) == {"/tmp": "ENOSPC", "/dev/shm": "ENOSPC"}  # 32 MB caps
    assert_healthy(jail, box)


def test_writing_to_the_agents_own_stderr_cannot_fill_the_host(jail, box):
    """Same-uid code can reopen the agent's fd 2 through /proc; it must lead nowhere on disk."""
    b = jail._instances[box].box
    code = """
import os
n = 0
for pid in ("1", "2"):
    try:
        with open(f"/proc/{pid}/fd/2", "wb", buffering=0) as f:
            for _ in range(64):
                n += f.write(b"x" * (1 << 20))
    except OSError as e:
        print(pid, e.strerror)
print("wrote", n >> 20)
"""
    run(jail, box, code, timeout=60)
    sizes = [os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(b.box_dir) for f in fs
             if not f.endswith(".img")]
    assert all(size < (1 << 20) for size in sizes), sizes
    assert b.stderr is not None and b.stderr.size <= 4096 + 65536  # bounded tail in host memory
    assert_healthy(jail, box)


def test_code_cannot_reach_the_agents_protocol_pipes(jail, box):
    """Forged frames written into the host stream could fake results or make the host buffer
    hundreds of MB; the agent is pid 1 and non-dumpable, so /proc/1/fd is closed to user code."""
    code = """
import os, json
out = {}
try:
    out["fds"] = os.listdir("/proc/1/fd")
except OSError as e:
    out["fds"] = e.strerror
for fd in range(0, 12):
    try:
        with open(f"/proc/1/fd/{fd}", "wb", buffering=0) as f:
            f.write(b"\\x7f\\xff\\xff\\xff" + b"{}")
        out[fd] = "WROTE"
    except OSError as e:
        out[fd] = e.strerror
print(json.dumps(out))
"""
    out = json.loads(run(jail, box, code).stdout)
    assert out.pop("fds") == "Permission denied"
    assert set(out.values()) <= {"Permission denied", "No such file or directory"}, out
    assert run(jail, box, "print('intact')").stdout == "intact\n"  # the host's stream is untouched
    assert_healthy(jail, box)


# -- kernel attack surface (seccomp) -------------------------------------------------------------

SYSCALLS_X86_64 = {"ptrace": 101, "mount": 165, "umount2": 166, "unshare": 272, "setns": 308, "keyctl": 250,
                   "add_key": 248, "bpf": 321, "perf_event_open": 298, "init_module": 175, "kexec_load": 246,
                   "userfaultfd": 323}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="syscall numbers below are x86_64")
def test_dangerous_syscalls_fail_with_eperm(jail, box):
    code = f"""
import ctypes, json, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {{}}
for name, nr in {SYSCALLS_X86_64!r}.items():
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0),
                      ctypes.c_long(0), ctypes.c_long(0))
    out[name] = errno.errorcode.get(ctypes.get_errno(), "OK") if rc == -1 else "OK"
print(json.dumps(out))
"""
    out = json.loads(run(jail, box, code).stdout)
    assert out == {name: "EPERM" for name in SYSCALLS_X86_64}
    r = run(jail, box, "grep Seccomp: /proc/self/status", "bash")
    assert r.stdout.split() == ["Seccomp:", "2"]
    assert_healthy(jail, box)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="io_setup's number below is x86_64's")
def test_a_box_cannot_reserve_the_hosts_async_io_capacity(jail, box):
    """io_setup(65536) took the whole host-wide fs.aio-max-nr: every other box and host service
    using Linux AIO then failed with EAGAIN. Linux AIO is denied like io_uring."""
    before = int(open("/proc/sys/fs/aio-nr").read())
    code = """
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ctx = ctypes.c_ulong(0)
rc = libc.syscall(ctypes.c_long(206), ctypes.c_long(65536), ctypes.byref(ctx))  # io_setup
print("OK" if rc == 0 else errno.errorcode.get(ctypes.get_errno()))
import time; time.sleep(0.5)
"""
    assert run(jail, box, code).stdout.strip() == "EPERM"
    assert int(open("/proc/sys/fs/aio-nr").read()) <= before + 1024  # nothing of the box's is held
    assert_healthy(jail, box)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x32 syscall numbering is x86_64's")
def test_foreign_abi_syscalls_kill_the_process(jail, box):
    """ptrace through the x32 ABI (nr | 0x40000000), a classic way around per-arch filters."""
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
            "libc.syscall(ctypes.c_long(0x40000000 | 101), 0, 0, 0, 0)\nprint('still alive')")
    r = run(jail, box, code)
    assert r.stdout == "" and r.metadata.get("signal") == 31  # SIGSYS from the filter's bad-arch action
    assert_healthy(jail, box)


def test_no_capabilities_no_new_privs_and_not_root(jail, box):
    r = run(jail, box, "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Uid|Gid):' /proc/self/status", "bash")
    fields = {line.split(":")[0]: line.split(":")[1].split() for line in r.stdout.splitlines()}
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[cap][0], 16) == 0, (cap, fields[cap])
    assert fields["NoNewPrivs"] == ["1"]
    assert set(fields["Uid"]) == {"1000"} and set(fields["Gid"]) == {"1000"}
    host_uid = os.stat(f"/proc/{jail._instances[box].box.proc.pid}").st_uid
    assert host_uid != 0  # on the host the box is an unprivileged uid too
    assert_healthy(jail, box)


def test_ptrace_traceme_mount_and_unshare_commands_fail(jail, box):
    code = """
import ctypes, json, errno, os
libc = ctypes.CDLL(None, use_errno=True)
out = {}
rc = libc.ptrace(0, 0, None, None)   # PTRACE_TRACEME normally always succeeds
out["ptrace"] = errno.errorcode.get(ctypes.get_errno()) if rc == -1 else "OK"
os.makedirs("/tmp/m", exist_ok=True)
rc = libc.mount(b"none", b"/tmp/m", b"tmpfs", 0, None)
out["mount"] = errno.errorcode.get(ctypes.get_errno()) if rc == -1 else "OK"
rc = libc.unshare(0x10000000)        # CLONE_NEWUSER
out["unshare"] = errno.errorcode.get(ctypes.get_errno()) if rc == -1 else "OK"
print(json.dumps(out))
"""
    assert json.loads(run(jail, box, code).stdout) == {"ptrace": "EPERM", "mount": "EPERM", "unshare": "EPERM"}
    r = run(jail, box, "unshare -r id; echo rc=$?", "bash")
    assert "rc=1" in r.stdout and "Operation not permitted" in r.stderr
    assert_healthy(jail, box)


# -- lifetime and isolation between instances ----------------------------------------------------

def test_daemonized_process_is_gone_after_destroy(jail):
    cgroups_ready()
    inst = jail.create_instance()
    b = jail._instances[inst.instance_id].box
    marker = "4242.123"
    code = f"""
import os, subprocess
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        subprocess.Popen(["sleep", "{marker}"], start_new_session=True)
        os._exit(0)
    os._exit(0)
import time; time.sleep(0.3); print("spawned")
"""
    assert run(jail, inst.instance_id, code).stdout == "spawned\n"

    def host_pids_with_marker() -> list[int]:
        found = []
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    if marker.encode() in open(f"/proc/{p}/cmdline", "rb").read():
                        found.append(int(p))
                except OSError:
                    pass
        return found

    # the agent kills what a one-shot run leaves behind; the cgroup catches whatever escapes that
    all_box_pids = b.cgroup.pids()
    jail.destroy_instance(inst.instance_id)
    assert wait_for(lambda: not host_pids_with_marker(), timeout=5)
    assert wait_for(lambda: not pids_alive(all_box_pids), timeout=5)
    assert drain() and not b.cgroup.exists()
    assert_healthy(jail)


def test_daemon_left_in_a_session_is_killed_by_destroy(jail):
    """A background process that survives its run (started via a context) dies with the box."""
    cgroups_ready()
    inst = jail.create_instance(session_id="daemon")
    b = jail._instances[inst.instance_id].box
    run(jail, inst.instance_id, "import subprocess; p = subprocess.Popen(['sleep', '777.5'])", context_id="ctx")
    pids = b.cgroup.pids()
    assert len(pids) >= 4  # bwrap, agent, context process, sleep
    jail.destroy_instance(inst.instance_id)
    assert wait_for(lambda: not pids_alive(pids), timeout=5)
    assert drain() and not b.cgroup.exists()


def test_one_instance_cannot_read_anothers_workspace(jail):
    a = jail.create_instance(session_id="alice")
    b = jail.create_instance(session_id="bob")
    try:
        jail.write_file(a.instance_id, "secret.txt", "alice-secret-991")
        a_host = jail._instances[a.instance_id].box.workspace
        code = f"""
import os, json
hits = []
for root, dirs, files in os.walk("/", onerror=lambda e: None):
    if root.startswith("/proc") or root.startswith("/sys"):
        dirs[:] = []
        continue
    if "secret.txt" in files:
        hits.append(root)
print(json.dumps({{"hits": hits, "host_path_exists": os.path.exists({a_host!r})}}))
"""
        out = json.loads(run(jail, b.instance_id, code, timeout=60).stdout)
        assert out == {"hits": [], "host_path_exists": False}
        with pytest.raises(InvalidConfigError):
            jail.read_file(b.instance_id, "../" + os.path.basename(a_host or "x") + "/secret.txt")
    finally:
        jail.destroy_instance(a.instance_id)
        jail.destroy_instance(b.instance_id)
