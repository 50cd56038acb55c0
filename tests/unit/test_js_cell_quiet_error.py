"""A JavaScript context cell that asks the agent to (``execbox.cell.quiet``, js_context.js: what
E2B's cell wrapper does first) has its error as the run's ``error`` only, not printed on stderr
too; what the cell writes itself stays, and a cell that does not ask is printed as ever."""

from __future__ import annotations

import shutil

import pytest

from .test_agent_execution_error import Runs, run  # noqa: F401 - the raw agent's runs
from .test_agent_request_order import agent  # noqa: F401 - the raw agent fixture

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node (JavaScript runtime) not installed")

QUIET = 'globalThis[Symbol.for("execbox.cell.quiet")]();\n'


def test_a_quiet_cells_error_is_its_error_only(run: Runs) -> None:  # noqa: F811
    ctx = {"context_id": "q"}
    v = run(QUIET + "console.error('mine');\nthrow new TypeError('thrown')", "javascript", **ctx)
    assert (v["exit_code"], v["error"]["name"], v["error"]["value"]) == (1, "TypeError", "thrown"), v
    assert "<cell>:3" in v["error"]["traceback"] and v["stderr"] == "mine\n", v
    v = run(QUIET + "await null;\nawait Promise.reject(42)", "javascript", **ctx)
    assert (v["exit_code"], v["error"], v["stderr"]) == (1, {"name": "Number", "value": "42", "traceback": "42\n"},
                                                         ""), v
    v = run(QUIET + "Promise.reject(new Error('floating')); 5", "javascript", **ctx)
    assert (v["error"]["value"], v["stderr"]) == ("floating", ""), v
    # a second error of the same cell is in no `error`: it is printed
    v = run(QUIET + "Promise.reject(new Error('first'));\nawait new Promise((r) => setTimeout(r, 20));\n"
            "throw new Error('second')", "javascript", **ctx)
    assert v["error"]["value"] == "first" and "Error: second" in v["stderr"] and "first" not in v["stderr"], v
    # the next cell did not ask: printed, as a plain context's cell is
    v = run("throw new RangeError('loud')", "javascript", **ctx)
    assert v["error"]["name"] == "RangeError" and v["error"]["traceback"] in v["stderr"], v
