"""A service holding more than 1024 descriptors still runs boxes (fd numbers past select's limit).

Each live session holds five of the service's descriptors and the service raises its open-file
limit (service/fd_limit.py), so a few hundred sessions put a new box's pipes above 1023. Filling
the low numbers with /dev/null stands in for those sessions."""

from __future__ import annotations

import os
import resource

import pytest

from .conftest import make_provider, run

FILL = 1100


@pytest.fixture
def low_numbers_taken():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < FILL + 256:
        pytest.skip(f"hard RLIMIT_NOFILE {hard} is too low to fill {FILL} descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, FILL + 256), hard))
    fds = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) for _ in range(FILL)]
    try:
        yield
    finally:
        for fd in fds:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_session_whose_pipes_are_numbered_above_1023_runs(low_numbers_taken):
    p = make_provider()
    try:
        inst = p.create_instance(tenant_id="t", session_id="s")
        client = p._get(inst.instance_id).box.client
        assert client.transport.read_fd >= 1024
        r = run(p, inst.instance_id, "print(6 * 7)")
        assert r.exit_code == 0 and r.stdout == "42\n"
        r = run(p, inst.instance_id, "import sys; sys.stderr.write('e' * 200000)")
        assert r.exit_code == 0 and len(r.stderr) == 200000
        p.destroy_instance(inst.instance_id)
    finally:
        p.shutdown()
