"""What the model reads in an MCP run result: a context that was restarted says its state is
gone (review 24: the text left it out, so a model went on as if `x` still existed)."""

from execbox.mcp.results import execution_result
from execbox.models import ExecutionResult


def _text(result: ExecutionResult) -> str:
    return execution_result(result, "s1").content[0].text


def test_a_restarted_contexts_note_reaches_the_text() -> None:
    note = "context 'mcp' was restarted: the process that held it ended; earlier state is gone"
    r = ExecutionResult(stdout="", stderr="NameError: name 'x' is not defined\n", exit_code=1, execution_time=0.1,
                        metadata={"context_note": note, "context_restarted": True})
    assert f"note: {note}" in _text(r).splitlines()
    plain = ExecutionResult(stdout="1\n", stderr="", exit_code=0, execution_time=0.1, metadata={})
    assert "note:" not in _text(plain)
