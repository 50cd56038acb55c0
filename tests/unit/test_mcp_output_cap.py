"""The model-facing cap of an MCP run result (mcp/output_cap.py) and the timeout hint's wording."""

from execbox.mcp.output_cap import cap_stream
from execbox.mcp.results import execution_result
from execbox.models import ExecutionResult


def test_short_text_is_untouched_and_zero_means_no_cap() -> None:
    assert cap_stream("abc\n", 10, "stdout").text == "abc\n"
    big = "y" * 100_000
    assert cap_stream(big, 0, "stdout").text == big


def test_long_text_keeps_whole_lines_of_its_head_and_tail() -> None:
    text = "".join(f"{i:04d}\n" for i in range(5000))  # 25000 characters
    out = cap_stream(text, 1000, "stderr")
    head, rest = out.text.split("\n[... ", 1)
    note, tail = rest.split("]\n", 1)
    assert text.startswith(head) and text.endswith(tail) and head.startswith("0000\n") and tail.endswith("4999\n")
    assert len(head) + len(tail) <= 1000 and len(head) >= 400 and len(tail) >= 400
    assert all(len(ln) == 4 for ln in (head + tail).splitlines())  # no line shown half
    assert out.total == 25000 and out.cut == 25000 - len(head) - len(tail)
    assert note.startswith(f"{out.cut} of 25000 characters of stderr cut here") and "read_file" in note


def _timeout_text(metadata: dict) -> str:
    r = ExecutionResult(stdout="", stderr="", exit_code=-1, execution_time=1.0, timed_out=True,
                        metadata={"error_code": "SB005", "error_message": "execution timed out", **metadata})
    return execution_result(r, "s1").content[0].text


def test_the_timeout_hint_follows_what_happened_to_the_context() -> None:
    kept = _timeout_text({"context_id": "mcp"})
    assert "interrupted" in kept and "keeps its state" in kept and "killed" not in kept
    lost = _timeout_text({"context_id": "mcp", "context_reset": True})
    assert "killed" in lost and "state is lost" in lost
    assert "keeps its state" not in _timeout_text({})
