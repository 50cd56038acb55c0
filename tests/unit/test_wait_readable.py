"""A box's stream is waited on with poll(2): descriptors numbered 1024 and above work too.

The service raises its open-file limit (service/fd_limit.py), so with a few hundred live boxes
its pipes and sockets get such numbers, which select(2) refuses."""

from __future__ import annotations

import os
import resource
import select
import socket

import pytest

from execbox.boxes.agent_client import PipeTransport, wait_readable

HIGH = 1500


@pytest.fixture
def high_fds():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= HIGH + 10:
        pytest.skip(f"hard RLIMIT_NOFILE {hard} leaves no descriptor above {HIGH}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH + 10), hard))
    opened: list[int] = []

    def make(fd: int, number: int) -> int:
        os.dup2(fd, number)
        os.close(fd)
        opened.append(number)
        return number

    yield make
    for fd in opened:
        try:
            os.close(fd)
        except OSError:
            pass
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_pipe_above_1023_is_read_through_the_transport(high_fds):
    r, w = os.pipe()
    r, w = high_fds(r, HIGH), high_fds(w, HIGH + 1)
    with pytest.raises(ValueError):
        select.select([r], [], [], 0)  # what the transport used before: it cannot wait on this one
    t = PipeTransport(w, r, owns_fds=False)
    with pytest.raises(TimeoutError):
        t.recv(64, 0.05)
    os.write(w, b"frame")
    assert t.recv(64, 1.0) == b"frame"
    os.close(w)
    assert wait_readable(r, 1.0) and t.recv(64, 1.0) == b""  # EOF counts as readable


def test_a_socket_above_1023_is_waited_on(high_fds):
    a, b = socket.socketpair()
    try:
        fd = high_fds(os.dup(a.fileno()), HIGH + 2)
        assert not wait_readable(fd, 0)
        b.sendall(b"x")
        assert wait_readable(fd, 1.0)
    finally:
        a.close()
        b.close()
