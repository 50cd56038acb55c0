"""Trying to break out of a docker box: root, capabilities, rootfs, network (netns test host)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import uuid

import pytest

from tests.conftest import require

pytestmark = pytest.mark.docker


def _box_status(provider, instance) -> dict[str, str]:
    r = provider.execute_code(instance, "cat /proc/self/status", "bash")
    return dict(line.split(":\t", 1) for line in r.stdout.splitlines() if ":\t" in line)


def test_runs_as_non_root_without_capabilities(provider, instance):
    r = provider.execute_code(instance, "id -u; id -g", "bash")
    uid = provider._instances[instance].box.host.uid  # its own host uid (test_box_uids.py)
    assert r.stdout.split() == [str(uid), str(uid)] and uid != 0
    st = _box_status(provider, instance)
    assert int(st["CapEff"], 16) == 0 and int(st["CapBnd"], 16) == 0
    r = provider.execute_code(instance, "import ctypes\nprint(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))",
                              "python")  # PR_GET_NO_NEW_PRIVS (gVisor's /proc has no NoNewPrivs line)
    assert r.stdout == "1\n", r.stderr
    if provider.runtime == "runc":  # gVisor filters syscalls in its own sentry instead
        assert st["Seccomp"].strip() == "2"


def test_root_filesystem_is_read_only(provider, instance):
    r = provider.execute_code(instance, "touch /usr/evil; touch /opt/execbox/execbox_agent/evil.py; "
                              "touch /tmp/ok && echo tmp-ok", "bash")
    assert r.stderr.count("cannot touch") == 2 and "tmp-ok" in r.stdout
    code = ("def main():\n    return {l.split()[1]: l.split()[3].split(',') for l in open('/proc/self/mounts')}")
    mounts = provider.execute_code(instance, code, "python").result
    assert "ro" in mounts["/"] and "ro" in mounts["/opt/execbox/execbox_agent"]
    assert "rw" in mounts["/tmp"] and "rw" in mounts["/workspace"]


def test_container_hardening_flags(provider, instance, docker_engine):
    box = provider._instances[instance].box
    attrs = docker_engine.api.inspect_container(box.container_id)
    hc = attrs["HostConfig"]
    assert hc["NetworkMode"] == "none" and hc["ReadonlyRootfs"] is True
    assert hc["CapDrop"] == ["ALL"] and "no-new-privileges" in hc["SecurityOpt"]
    # the agent's privsep only, and under runsc (gVisor's own capabilities) its PID namespace
    privsep = ["SETGID", "SETPCAP", "SETUID"]
    assert sorted(hc["CapAdd"]) == (privsep + ["SYS_ADMIN"] if provider.runtime == "runsc" else privsep)
    assert not any("unconfined" in o for o in hc["SecurityOpt"])
    profile = json.loads(next(o for o in hc["SecurityOpt"] if o.startswith("seccomp="))[len("seccomp="):])
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW" and "keyctl" in profile["syscalls"][0]["names"]
    assert hc["Memory"] == (512 if provider.runtime == "runsc" else 256) * 1024**2
    assert hc["MemorySwap"] == hc["Memory"]
    from execbox.providers.docker import runsc_host_pids

    assert hc["PidsLimit"] == (runsc_host_pids(64) if provider.runtime == "runsc" else 64)
    assert hc["NanoCpus"] == 10**9 and hc["Runtime"] == provider.runtime
    assert "/tmp" in hc["Tmpfs"]
    assert attrs["Config"]["User"] == "0:0"  # the agent; user code runs as the box's uid (agent/privsep.py)
    assert box.hello["privsep"] == "uid"
    labels = attrs["Config"]["Labels"]
    assert {"execbox.tenant", "execbox.session", "execbox.instance", "execbox.owner"} <= set(labels)
    # a size-limited workspace (an ext4 image as root, else a tmpfs): never an unbounded volume
    assert not any(m["Destination"] == "/workspace" and m["Type"] == "volume" for m in attrs["Mounts"])
    assert any(m["Destination"] == "/opt/execbox/execbox_agent" and not m["RW"] for m in attrs["Mounts"])


def test_no_host_copy_of_the_agents_output(provider, instance, docker_engine):
    """dockerd's json-file driver kept an unbounded host copy of every reply: file contents, output."""
    box = provider._instances[instance].box
    provider.write_file(instance, "creds.env", "DB_PASSWORD=tenant-secret-4711\n")
    assert "tenant-secret-4711" in provider.read_file(instance, "creds.env").content
    r = provider.execute_code(instance, "print('out-marker-' * 1000)", "python")
    assert r.exit_code == 0, r.stderr
    attrs = docker_engine.api.inspect_container(box.container_id)
    assert attrs["HostConfig"]["LogConfig"]["Type"] == "none"
    assert not attrs.get("LogPath")  # no log file on the host at all
    assert not os.path.exists(os.path.join("/var/lib/docker/containers", box.container_id,
                                           f"{box.container_id}-json.log"))


NET_PROBE = """
import socket, sys
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return "connected"
    except OSError as e:
        return type(e).__name__
def dns():
    try:
        socket.getaddrinfo("pypi.org", 443)
        return "resolved"
    except OSError as e:
        return type(e).__name__
def main(host, port, lo_port):
    return {"netns": tcp(host, port), "loopback": tcp("127.0.0.1", lo_port), "dns": dns(),
            "ifaces": [n for _, n in socket.if_nameindex()]}
"""


@pytest.fixture
def netns_host():
    """A throwaway test host in its own network namespace, reachable from the host over a veth."""
    require(shutil.which("ip") is not None, "iproute2 (ip)")
    tag = uuid.uuid4().hex[:6]
    ns, veth_h, veth_n = f"xbx{tag}", f"xbh{tag}", f"xbn{tag}"
    octet = int(tag[:2], 16)
    host_ip, ns_ip = f"10.249.{octet}.1", f"10.249.{octet}.2"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)  # noqa: S603,S607

    ip("netns", "add", ns)
    proc = None
    try:
        ip("link", "add", veth_h, "type", "veth", "peer", "name", veth_n)
        ip("link", "set", veth_n, "netns", ns)
        ip("addr", "add", f"{host_ip}/30", "dev", veth_h)
        ip("link", "set", veth_h, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", veth_n)
        ip("netns", "exec", ns, "ip", "link", "set", veth_n, "up")
        proc = subprocess.Popen(  # noqa: S603,S607 - fixed argv
            ["ip", "netns", "exec", ns, "/usr/bin/python3", "-c",
             "import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
             f"s.bind(('{ns_ip}',8765));s.listen();print('up',flush=True)\n"
             "while True:\n c,_=s.accept();c.close()"], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"up"
        socket.create_connection((ns_ip, 8765), timeout=5).close()  # reachable from the host
        yield ns_ip, 8765
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        subprocess.run(["ip", "link", "del", veth_h], capture_output=True)  # noqa: S603,S607
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # noqa: S603,S607


@pytest.fixture
def loopback_listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                srv.accept()[0].close()
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    srv.close()


def test_no_network(provider, instance, netns_host, loopback_listener):
    host, port = netns_host
    r = provider.execute_code(instance, NET_PROBE, "python",
                              arguments={"host": host, "port": port, "lo_port": loopback_listener})
    assert r.exit_code == 0, r.stderr
    assert r.result["netns"] != "connected"
    assert r.result["loopback"] != "connected"  # the box's lo is its own, not the host's
    assert r.result["dns"] != "resolved"
    assert set(r.result["ifaces"]) <= {"lo"}
