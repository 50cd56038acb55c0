"""A failed cell's ``execution.error`` is the one execbox's agent reports (name, value and the
traceback as the cell printed it), not a reading of its stderr: a message of several lines is
whole, and what the cell printed on stderr before it failed stays in ``logs.stderr`` only."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from .conftest import Server, module_sandbox

ci = pytest.importorskip("e2b_code_interpreter")


@pytest.fixture(scope="module")
def sbx(e2b_server: Server) -> Iterator[object]:
    with module_sandbox(e2b_server, lambda: ci.Sandbox.create(timeout=300)) as sandbox:
        yield sandbox


def test_python_error_is_the_agents(sbx) -> None:
    ex = sbx.run_code("import sys\nprint('NotMine: decoy', file=sys.stderr)\nraise ValueError('first\\nsecond')")
    assert (ex.error.name, ex.error.value) == ("ValueError", "first\nsecond"), ex.error
    assert ex.error.traceback.startswith("Traceback (most recent call last):\n"), ex.error.traceback
    assert 'File "Cell In[' in ex.error.traceback and "decoy" not in ex.error.traceback, ex.error.traceback
    assert ex.logs.stderr[0] == "NotMine: decoy\n", ex.logs.stderr
    assert sbx.run_code("1 + 1").error is None


def test_javascript_error_is_the_agents(sbx) -> None:
    if shutil.which("node") is None:
        pytest.skip("node (JavaScript runtime) not installed")
    ex = sbx.run_code("console.error('NotMine: decoy');\nthrow new RangeError('first\\nsecond')", language="javascript")
    assert (ex.error.name, ex.error.value) == ("RangeError", "first\nsecond"), ex.error
    assert "<cell>:2" in ex.error.traceback and "decoy" not in ex.error.traceback, ex.error.traceback
