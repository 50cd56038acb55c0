"""Attack-test fixtures: the jail provider fixtures plus a network-namespace test host."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

from tests.conftest import require
from tests.integration.jail.conftest import box, jail  # noqa: F401 - re-exported fixtures

# A throwaway test host that exists only inside a network namespace this fixture creates:
# the host reaches it over a veth pair; a box must not. No other address is ever targeted.
NETNS_HOST_IP = "10.213.77.2"
NETNS_PEER_IP = "10.213.77.1"
NETNS_PORT = 18080

SERVER = (
    "import socket,sys\n"
    "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "s.bind((sys.argv[1],int(sys.argv[2])));s.listen(8)\n"
    "u=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);u.bind((sys.argv[1],53))\n"
    "print('ready',flush=True)\n"
    "while True:\n c,_=s.accept();c.sendall(b'netns-host');c.close()\n"
)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(scope="session")
def netns_host():
    """(ip, port) of a TCP listener inside a fresh network namespace reachable from the host."""
    require(shutil.which("ip") is not None and os.geteuid() == 0, "iproute2 + root (network namespace test host)")
    ns = f"execbox-t{os.getpid()}"
    veth = f"exbx{os.getpid() % 100000}"
    _ip("netns", "add", ns)
    server = None
    try:
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("addr", "add", f"{NETNS_PEER_IP}/30", "dev", veth)
        _ip("link", "set", veth, "up")
        _ip("-n", ns, "addr", "add", f"{NETNS_HOST_IP}/30", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        server = subprocess.Popen(["ip", "netns", "exec", ns, "/usr/bin/python3", "-I", "-c", SERVER,
                                   NETNS_HOST_IP, str(NETNS_PORT)], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        # Positive control: the host itself reaches the test host.
        deadline = time.monotonic() + 5
        while True:
            try:
                with socket.create_connection((NETNS_HOST_IP, NETNS_PORT), timeout=2) as c:
                    assert c.recv(64) == b"netns-host"
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield NETNS_HOST_IP, NETNS_PORT
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", veth], stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


@pytest.fixture
def loopback_listener():
    """A TCP listener on the host's 127.0.0.1 that records every connection it accepts."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    yield srv
    srv.close()
