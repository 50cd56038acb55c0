"""What the model reads in an MCP run result: a context that was restarted says its state is
gone (review 24: the text left it out, so a model went on as if `x` still existed)."""

from execbox.errors import RateLimitError
from execbox.mcp.results import error_result, execution_result, process_state
from execbox.models import ExecutionResult
from execbox.service.background import BgProcess


def _text(result: ExecutionResult) -> str:
    return execution_result(result, "s1").content[0].text


def test_a_restarted_contexts_note_reaches_the_text() -> None:
    note = "context 'mcp' was restarted: the process that held it ended; earlier state is gone"
    r = ExecutionResult(stdout="", stderr="NameError: name 'x' is not defined\n", exit_code=1, execution_time=0.1,
                        metadata={"context_note": note, "context_restarted": True})
    assert f"note: {note}" in _text(r).splitlines()
    plain = ExecutionResult(stdout="1\n", stderr="", exit_code=0, execution_time=0.1, metadata={})
    assert "note:" not in _text(plain)


def test_the_sb008_hint_says_what_frees_the_limit_that_was_hit() -> None:
    """Review 32, F5: a cap on processes held said "retry shortly", which cannot help."""
    def text(**details: object) -> str:
        return error_result(RateLimitError("too many", details=details)).content[0].text

    for reason in ("tenant_max_background_processes", "max_background_processes"):
        hint = text(limit=5, reason=reason)
        assert "kill_process one you no longer need" in hint and "list_processes" in hint, hint
        assert "retry shortly" not in hint
    assert "kill_process" in text(field="command")  # the box's own cap (agent/background.py)
    assert "close_session one you no longer need" in text(reason="tenant_max_sessions", limit=3)
    assert "retry shortly" in text(reason="tenant_max_executions", limit=3)
    assert "retry shortly" in text(reason="tenant_max_requests", limit=3)
    assert "retry shortly" in text(reason="mcp_sessions", limit=3)
    assert "not reading its stdin" in text(written=0)
    assert "existing context_id" in text(field="context_id")
    assert "GPU" in text(field="gpu_tenant_cap")
    assert "retry in about 7 s" in text(retry_after=7)
    assert text().startswith("error SB008: too many\n")


def test_a_process_over_in_the_box_is_not_said_to_run() -> None:
    """Review 32, F7: the box's end (its poll's `ended`, with the final sizes) reaches info() and the
    model's line before the service has taken all the output."""
    p = BgProcess(8, "seq 1 500000", None, "t", "s", None, "box", False, None)  # type: ignore[arg-type]
    p.saw_poll({"ended": False, "stdout_size": 10, "stderr_size": 0})
    assert "exited_in_box" not in p.info() and process_state(p.info()) == "pid 8 running: seq 1 500000"
    p.saw_poll({"ended": True, "stdout_size": 3_388_895, "stderr_size": 4})
    info = p.info()
    assert info["running"] is True and info["exited_in_box"] is True
    assert (info["stdout_size"], info["stderr_size"]) == (3_388_895, 4)
    assert "exited in the box, its output not all read yet" in process_state(info)
    read = {**info, "stdout_waiting": 2_000_000, "stderr_waiting": 4}
    assert "exited in the box, 2000004 bytes of output left to read" in process_state(read)
    p.ended, p.exit_code = True, 0
    assert "exited_in_box" not in p.info() and process_state(p.info()).startswith("pid 8 exited with code 0")
