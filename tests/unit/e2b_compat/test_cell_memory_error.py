"""A `MemoryError` in an E2B Python cell, on a real agent process (review 38, F8): the run's error
is the cell's own (its traceback starts at ``Cell In[N]``, never the launcher's ``__e2b_m.run``
or the agent's frames) and is not printed on stderr too, as for any other cell error; the run
still says the allocation failed (``oom``), so the service can tell."""

from __future__ import annotations

from typing import Any

from execbox.service.e2b_compat.cells import python_cell

from ..test_agent_request_order import RawAgent, agent  # noqa: F401 - the raw agent fixture


def _run(raw: RawAgent, rid: int, code: str) -> dict[str, Any]:
    raw.send_together({"id": rid, "op": "exec", "language": "python", "code": python_cell(code),
                       "timeout": 20, "context_id": "m"})
    reply = raw.reply(rid, timeout=30)
    assert reply is not None and reply["ok"], reply
    return reply["value"]


def test_a_memory_error_is_the_cells_own_error_and_not_on_stderr(agent: RawAgent) -> None:  # noqa: F811
    v = _run(agent, 1, "y = 1\nraise MemoryError()")
    err = v["error"]
    assert (err["name"], err["value"]) == ("MemoryError", ""), err
    assert err["traceback"] == ('Traceback (most recent call last):\n  File "Cell In[1]", line 2, in <module>\n'
                                "    raise MemoryError()\nMemoryError\n"), err["traceback"]
    assert v["stderr"] == "", v["stderr"]
    assert v["exit_code"] == 1
    assert v["oom"] is True  # still flagged: an allocation failed
    # one raised deeper, with a message: the cell's frames only
    v = _run(agent, 2, "def grow():\n    raise MemoryError('no room')\ngrow()")
    assert v["error"]["traceback"].splitlines()[1:] == [
        '  File "Cell In[2]", line 3, in <module>', "    grow()", '  File "Cell In[2]", line 2, in grow',
        "    raise MemoryError('no room')", "MemoryError: no room"], v["error"]["traceback"]
    assert v["stderr"] == ""
    assert _run(agent, 3, "y + 1")["result"]["json"] == '{"__e2b_display__":{"text":"2"}}'  # the context lives on
