"""`execbox serve` raises its soft open-file limit before any box starts (service/fd_limit.py)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

from tests.serve_process import stop


def _soft_nofile(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/limits", encoding="ascii") as f:
            line = next(ln for ln in f if ln.startswith("Max open files"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[3])


def test_serve_started_with_a_1024_soft_limit_raises_it(tmp_path):
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        pytest.skip(f"hard RLIMIT_NOFILE {hard}: nothing to raise to")
    child_hard = min(hard, 1 << 16) if hard != resource.RLIM_INFINITY else 1 << 16

    def as_systemd_starts_it() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, child_hard))

    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_") and k != "EXECBOX_DATABASE_URL"}
    env.update({"EXECBOX_DATA_DIR": str(tmp_path), "SANDBOX_TYPE": "local"})
    proc = subprocess.Popen([sys.executable, "-m", "execbox", "serve", "--host", "127.0.0.1", "--port", "0",
                             "--log-level", "warning"], env=env, preexec_fn=as_systemd_starts_it,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        soft = _soft_nofile(proc.pid)
        while soft != child_hard and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            soft = _soft_nofile(proc.pid)
        if soft != child_hard and proc.poll() is not None:
            pytest.fail(f"serve exited {proc.returncode} with soft limit {soft}: {proc.stderr.read()[-2000:]!r}")
        assert soft == child_hard
    finally:
        stop(proc)
