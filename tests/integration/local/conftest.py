"""A local-provider sandbox for a test module (the same agent runs in every self-hosted box), and
the agent's JavaScript context driven directly over its request and reply pipes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from execbox import Sandbox
from execbox.agent import js_contexts

AGENT_DIR = Path(js_contexts.__file__).parent


@contextlib.contextmanager
def local_box(max_memory: str) -> Iterator[Sandbox]:
    from execbox.providers.local import LocalProvider

    p = LocalProvider()
    p.initialize({"max_memory": max_memory})
    try:
        with Sandbox.create(p) as s:
            yield s
    finally:
        p.shutdown()


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    """One local sandbox (1 GiB) for the test module."""
    with local_box("1g") as s:
        yield s


@pytest.fixture
def needs_node(node_available: bool) -> None:
    if not node_available:
        pytest.skip("node is not installed")


@contextlib.contextmanager
def js_context(cwd: Path, env: dict[str, str] | None = None, node_args: tuple[str, ...] = ()) -> Iterator[Any]:
    """``js_context.js`` run by ``node`` in ``cwd``: yields ``cell(code)``, which sends one cell
    and returns its reply; stderr is at ``cell.stderr()`` once the context has ended."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()

    def fds() -> None:  # the pipes as fds 3 and 4 (kept open by pass_fds), whichever numbers they had
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (req_r, rep_w)]
        os.dup2(high[0], 3)
        os.dup2(high[1], 4)

    proc = subprocess.Popen(["node", *node_args, str(AGENT_DIR / "js_context.js")], preexec_fn=fds,
                            pass_fds=(3, 4), cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(req_r)
    os.close(rep_w)
    replies = os.fdopen(rep_r)

    def cell(code: str) -> dict[str, Any]:
        os.write(req_w, (json.dumps({"code": code, "cwd": str(cwd)}) + "\n").encode())
        return json.loads(replies.readline() or "{}")

    cell.stderr = lambda: proc.stderr.read().decode()  # type: ignore[attr-defined]
    try:
        yield cell
    finally:
        os.close(req_w)
        proc.wait(10)
        replies.close()
