"""The exception that ended the user's code, as the agent reports it: ``error`` in the exec reply,
``{name, value, traceback}`` (E2B's ``execution.error``), None when the code raised nothing.

A real agent process on pipes (the raw agent of test_agent_request_order); then the pieces the
reply goes through on the host (pump.parse_result, result_from_reply, ExecutionResult's JSON and
the remote SDK's decoding)."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from execbox.agent import pump
from execbox.errors import ConnectionFailedError
from execbox.models import ExecutionResult
from execbox.providers.agent_result import result_from_reply
from execbox.sdk.wire import result_from

from .test_agent_request_order import RawAgent, agent  # noqa: F401 - the raw agent fixture

needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="node (JavaScript runtime) not installed")


class Runs:
    def __init__(self, raw: RawAgent) -> None:
        self.raw = raw
        self.rid = 0

    def __call__(self, code: str, language: str = "python", **kw: Any) -> dict[str, Any]:
        self.rid += 1
        self.raw.send_together({"id": self.rid, "op": "exec", "language": language, "code": code, "timeout": 20,
                                **kw})
        reply = self.raw.reply(self.rid, timeout=30)
        assert reply is not None and reply["ok"], reply
        return reply["value"]


@pytest.fixture
def run(agent: RawAgent) -> Runs:  # noqa: F811
    return Runs(agent)


def test_a_python_exception_is_the_runs_error_with_the_traceback_printed(run: Runs) -> None:
    v = run("x = 1\ndef f():\n    return x / 0\nf()")
    assert v["exit_code"] == 1
    err = v["error"]
    assert (err["name"], err["value"]) == ("ZeroDivisionError", "division by zero")
    assert err["traceback"] == v["stderr"]  # the same text, as python3 prints it
    assert err["traceback"].startswith("Traceback (most recent call last):\n")
    assert 'File "<code>", line 3, in f' in err["traceback"] and "agent" not in err["traceback"]
    # main()'s own exception, called with arguments
    err = run("def main(a):\n    raise KeyError(a)", arguments={"a": "k"})["error"]
    assert (err["name"], err["value"]) == ("KeyError", "'k'")
    # a user type's __str__ that fails is named as traceback names it
    err = run("class E(Exception):\n    def __str__(self):\n        raise RuntimeError\nraise E()")["error"]
    assert (err["name"], err["value"]) == ("E", "<exception str() failed>")


def test_a_syntax_error_counts_and_sys_exit_does_not(run: Runs) -> None:
    v = run("def broken(:\n    pass")
    assert v["exit_code"] == 1 and v["error"]["name"] == "SyntaxError"
    assert v["error"]["value"].startswith("invalid syntax") and v["error"]["traceback"] == v["stderr"]
    for code, exit_code in (("import sys; sys.exit(3)", 3), ("raise SystemExit('bye')", 1), ("print('ok')", 0),
                            ("import os; os._exit(4)", 4)):
        v = run(code)
        assert (v["exit_code"], v["error"]) == (exit_code, None), (code, v)


def test_context_cells_report_their_own_error_and_the_next_cell_none(run: Runs) -> None:
    ctx = {"context_id": "c"}
    assert run("def boom():\n    return {}['k']", **ctx)["error"] is None
    v = run("import asyncio\nawait asyncio.sleep(0)\nboom()", **ctx)
    assert (v["error"]["name"], v["error"]["value"]) == ("KeyError", "'k'")
    assert "asyncio" not in v["error"]["traceback"] and 'File "<cell 1>", line 2, in boom' in v["error"]["traceback"]
    v = run("1 + 1", **ctx)
    assert (v["error"], v["result"]["json"]) == (None, "2")


def test_a_cell_wrapper_reports_the_users_exception_itself(run: Runs) -> None:
    """E2B's cell driver prints its own traceback and ends the cell with SystemExit(1): the
    exception and the text it hands to py_cells.report are the run's error."""
    code = ("import sys\ncell = sys.modules['_execbox_cell']\ntry:\n    int('x')\nexcept ValueError as e:\n"
            "    cell.report(e, 'my own text\\n')\n    raise SystemExit(1) from None")
    v = run(code, context_id="w")
    assert v["exit_code"] == 1
    assert v["error"] == {"name": "ValueError", "value": "invalid literal for int() with base 10: 'x'",
                          "traceback": "my own text\n"}
    assert run("import sys; sys.exit(2)", context_id="w")["error"] is None  # reported once, not again


def test_bash_has_no_error_even_when_it_writes_one(run: Runs) -> None:
    forged = '{"error":{"name":"Forged","value":"v","traceback":"t"}}'
    v = run(f"echo '{forged}' >&3 2>/dev/null; exit 2", "bash")
    assert (v["exit_code"], v["error"]) == (2, None)
    v = run("false", "bash", context_id="s")
    assert v["exit_code"] == 1 and v["error"] is None


def test_an_error_is_held_to_the_output_cap(run: Runs) -> None:
    v = run("raise ValueError('v' * 100000)", output_cap=4096)
    assert v["error"]["name"] == "ValueError"
    assert len(v["error"]["value"]) <= 4096 and len(v["error"]["traceback"]) <= 4096
    assert v["error"]["value"].startswith("vvv") and "characters cut" in v["error"]["value"]
    assert v["error"]["traceback"].rstrip().endswith("v" * 100)  # the tail names the error


@needs_node
def test_javascript_uncaught_errors_and_rejections(run: Runs) -> None:
    v = run("const a = 1;\nthrow new TypeError('x')", "javascript")
    assert v["exit_code"] == 1
    err = v["error"]
    assert (err["name"], err["value"]) == ("TypeError", "x")
    assert "<code>:2" in err["traceback"] and err["traceback"] in v["stderr"]
    err = run("setTimeout(() => { throw new RangeError('late') }, 1)", "javascript")["error"]
    assert (err["name"], err["value"]) == ("RangeError", "late")
    err = run("async function f() { throw new Error('rejected') }\nf()", "javascript")["error"]
    assert (err["name"], err["value"]) == ("Error", "rejected")
    err = run("import fs from 'node:fs';\nawait null;\nthrow new SyntaxError('esm')", "javascript")["error"]
    assert (err["name"], err["value"]) == ("SyntaxError", "esm")
    # Node's code is in the stack's heading, not the name
    err = run("require('fs').readFileSync(undefined)", "javascript")["error"]
    assert err["name"] == "TypeError" and err["value"].startswith('The "path" argument must be')
    err = run("throw {code: 42}", "javascript")["error"]
    assert (err["name"], err["value"]) == ("Object", "{ code: 42 }")
    err = run("function main(args) { null.x }", "javascript", arguments={"n": 1})["error"]
    assert err["name"] == "TypeError" and "null" in err["value"]
    for code in ("console.log(1)", "process.exit(3)", "const x = 1;"):
        assert run(code, "javascript")["error"] is None, code


@needs_node
def test_javascript_context_cells(run: Runs) -> None:
    ctx = {"context_id": "j"}
    v = run("let q = 1;\nawait null;\nthrow new TypeError('bad thing')", "javascript", **ctx)
    assert (v["error"]["name"], v["error"]["value"]) == ("TypeError", "bad thing")
    assert "<cell>:3" in v["error"]["traceback"]
    v = run("q + 1", "javascript", **ctx)
    assert (v["error"], v["result"]["json"]) == (None, "2")
    assert v["stderr"] == ""


@needs_node
def test_javascript_context_cells_own_their_late_errors(run: Runs) -> None:
    """A rejection nobody handled, or a callback's error, raised before the cell answers is that
    cell's error (and stderr); one raised after it answered is no later cell's error."""
    ctx = {"context_id": "late"}
    v = run('Promise.reject(new Error("floating rej")); 5', "javascript", **ctx)
    assert v["exit_code"] == 1 and not (v["result"] or {}).get("present"), v
    assert (v["error"]["name"], v["error"]["value"]) == ("Error", "floating rej"), v
    assert "Error: floating rej" in v["stderr"] and v["error"]["traceback"] in v["stderr"]
    v = run("setImmediate(() => { throw new RangeError('soon') }); 6", "javascript", **ctx)
    assert (v["error"]["name"], v["error"]["value"]) == ("RangeError", "soon"), v
    v = run("await null; Promise.reject(42); 7", "javascript", **ctx)
    assert (v["error"]["name"], v["error"]["value"]) == ("Number", "42"), v
    assert "nothing handled it" in v["stderr"]
    # a timer that fires after its cell answered: printed, said to be another's, no cell's error
    v = run("setTimeout(() => { throw new Error('late cb') }, 50); 8", "javascript", **ctx)
    assert (v["exit_code"], v["error"], v["result"]["json"], v["stderr"]) == (0, None, "8", ""), v
    v = run("await new Promise((r) => setTimeout(r, 300)); 9", "javascript", **ctx)
    assert (v["exit_code"], v["error"], v["result"]["json"]) == (0, None, "9"), v
    assert "not this cell's" in v["stderr"] and "Error: late cb" in v["stderr"], v
    v = run("10", "javascript", **ctx)
    assert (v["error"], v["stderr"]) == (None, ""), v


@needs_node
def test_javascript_thrown_null_and_tracebacks_end_with_a_line_break(run: Runs) -> None:
    for language_kw in ({}, {"context_id": "n"}):
        for code, name in (("throw null", "null"), ("throw undefined", "undefined")):
            err = run(code, "javascript", **language_kw)["error"]
            assert (err["name"], err["value"]) == (name, name), (code, language_kw, err)
        v = run("throw new TypeError('x')", "javascript", **language_kw)
        assert v["error"]["traceback"].endswith("\n") and v["error"]["traceback"] in v["stderr"], v


def test_parse_result_keeps_the_first_well_formed_error() -> None:
    first = {"name": "A", "value": "a", "traceback": "ta"}
    raw = json.dumps({"error": {"name": 1}}) + json.dumps({"error": first}) + json.dumps(
        {"error": {"name": "B", "value": "b", "traceback": "tb"}})
    assert pump.parse_result(raw.encode())[3] == first
    assert pump.parse_result(b'{"result": {"present": false}}')[3] is None


def test_the_error_travels_to_execution_result_json_and_back() -> None:
    err = {"name": "ZeroDivisionError", "value": "division by zero", "traceback": "Traceback ...\n"}
    reply = {"stdout": "", "stderr": err["traceback"], "exit_code": 1, "execution_time": 0.01, "error": err}
    r = result_from_reply(reply, {}, oom=False, wall=0.02, fetch=None)
    assert r.error == err
    body = r.to_dict()
    assert body["error"] == err
    back = result_from(json.loads(json.dumps(body)), None)
    assert back.error == err
    assert ExecutionResult.from_dict({**body, "error": None}).error is None
    # an agent that sends none, or a malformed one: no error, the run stands
    assert result_from_reply({**reply, "error": "x"}, {}, oom=False, wall=0.0, fetch=None).error is None
    del reply["error"]
    assert result_from_reply(reply, {}, oom=False, wall=0.0, fetch=None).error is None
    # a service that sends a malformed one: the SDK says so
    with pytest.raises(ConnectionFailedError):
        result_from({**body, "error": {"name": "X", "value": 3}}, None)


def test_ragflow_run_answer_keeps_its_contract() -> None:
    """RAGFlow's /run shape has no field for it (its ``error`` is execbox's SB error of a runner
    failure): a program's exception stays out of the /run answer."""
    from execbox.service.routes.executor_results import result_to_response

    err = {"name": "ZeroDivisionError", "value": "division by zero", "traceback": "tb"}
    body = result_to_response(ExecutionResult("", "tb", 1, 0.01, error=err))
    assert "error" not in body and body["status"] == "program_error"
