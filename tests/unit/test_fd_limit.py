"""The service raises its soft open-file limit before boxes start (each session box holds five)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

from execbox.service import fd_limit

CHILD = (
    "import json, resource\n"
    "from execbox.service.fd_limit import raise_open_file_limit\n"
    "before, after = raise_open_file_limit()\n"
    "print(json.dumps([before, after, list(resource.getrlimit(resource.RLIMIT_NOFILE))]))\n"
)


def _in_child(soft: int, hard: int) -> list:
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    out = subprocess.run([sys.executable, "-c", CHILD], preexec_fn=lower, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def test_a_1024_soft_limit_is_raised_to_the_hard_one():
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"this process's hard RLIMIT_NOFILE is {hard}: nothing to raise to")
    hard_child = min(hard, 1 << 16) if hard != resource.RLIM_INFINITY else 1 << 16  # under fd_limit.CEILING
    assert hard_child <= fd_limit.CEILING
    before, after, now = _in_child(1024, hard_child)
    assert before == 1024 and after == hard_child and now == [hard_child, hard_child]


def test_a_soft_limit_already_at_the_hard_one_is_left():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("unlimited hard RLIMIT_NOFILE")
    before, after, now = _in_child(min(hard, 4096), min(hard, 4096))
    assert before == after == min(hard, 4096) and now == [after, after]
