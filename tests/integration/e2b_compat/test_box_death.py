"""A sandbox whose box died (the OOM killer, a crash, kill -9 from the host), through the official
SDK: the next call runs on a new box with the sandbox's files, as the sandbox is still alive; and a
killed sandbox is what the SDK calls "not running" (review 38, F1 and F2).

Before, the first call after a box death answered the HTTP API's "SB009 once" (the box died, it is
made again on next use), which the SDKs read as a sandbox that is gone (the JS SDK: "Sandbox is
probably not running anymore"); a `files.write` that met it was lost, and `run_code` reported an
error for code that never ran."""

from __future__ import annotations

import pytest

from .conftest import Server, kill_box

ci = pytest.importorskip("e2b_code_interpreter")
e2b = pytest.importorskip("e2b")


def test_the_first_call_after_a_box_death_runs_on_a_new_box(e2b_env: Server) -> None:
    sandbox = ci.Sandbox.create(timeout=120)
    try:
        sandbox.files.write("/home/user/keep.txt", "kept")
        kill_box(sandbox)
        assert sandbox.commands.run("cat /home/user/keep.txt").stdout == "kept"  # no error, files intact

        kill_box(sandbox)
        execution = sandbox.run_code("6 * 7")
        assert execution.error is None and execution.text == "42", execution

        kill_box(sandbox)
        sandbox.files.write("/home/user/after.txt", "written")  # not dropped
        assert sandbox.files.read("/home/user/after.txt") == "written"
        assert sandbox.is_running()
    finally:
        sandbox.kill()


def test_a_killed_sandbox_is_not_running_for_the_sdk(e2b_env: Server) -> None:
    sandbox = e2b.Sandbox.create(timeout=120)
    sandbox.kill()
    with pytest.raises(e2b.exceptions.SandboxNotRunningException):  # "killed or reached its timeout"
        sandbox.commands.run("echo hi")
    with pytest.raises(e2b.exceptions.SandboxNotRunningException):
        sandbox.files.read("/home/user/x")


def test_the_first_cell_after_a_box_death_says_earlier_state_is_gone(e2b_env: Server) -> None:
    from execbox.service.e2b_compat.interpreter import CONTEXTS_LOST

    sandbox = ci.Sandbox.create(timeout=120)
    try:
        assert sandbox.run_code("rows = 41").error is None
        kill_box(sandbox)
        execution = sandbox.run_code("rows + 1")
        assert execution.error is not None and execution.error.name == "NameError"  # the state went with its box
        assert CONTEXTS_LOST in "".join(execution.logs.stderr), execution.logs  # and the cell is told why
        again = sandbox.run_code("rows = 1; rows + 1")
        assert again.text == "2" and not "".join(again.logs.stderr), again.logs  # said once
    finally:
        sandbox.kill()
