"""A run's ``main()`` value is capped like stdout and stderr (the output cap, 1 MiB here): a value
whose JSON is over it is dropped in the box's agent (result null, truncated true, a line on stderr
saying why) instead of travelling whole to the service, for Python and JavaScript, one-shot and in
a context. Values under the cap come back whole."""

from __future__ import annotations

import pytest

from .conftest import run

CAP = 1024 * 1024


def assert_dropped(r, n_bytes: int | None = None) -> None:
    assert r.result is None and r.truncated is True, (r.exit_code, r.stderr[-400:])
    assert r.metadata["result_present"] is False
    assert "over the output cap of 1048576 bytes; it was dropped" in r.stderr
    if n_bytes is not None:
        assert f"is {n_bytes} bytes as JSON" in r.stderr
    assert r.exit_code == 0
    assert len(r.stdout) < 1000 and len(r.stderr) < 4096


@pytest.mark.parametrize("size", [3 * CAP, CAP + CAP // 2, 20 * CAP])
def test_a_python_value_over_the_cap_is_dropped(jail, box, size):
    r = run(jail, box, f"def main():\n    return 'x' * {size}\n", timeout=60)
    # 1.5 MiB is parsed and measured; 3 and 20 MiB pass the pipe's bound and are cut on the way
    assert_dropped(r, size + 2 if size < 2 * CAP else None)


def test_escaping_counts_and_a_value_under_the_cap_comes_back_whole(jail, box):
    r = run(jail, box, f"def main():\n    return '\"' * {CAP // 2}\n")  # JSON: a backslash per quote
    assert_dropped(r, CAP + 2)
    r = run(jail, box, f"def main():\n    return 'y' * {CAP - 2}\n")  # exactly the cap as JSON
    assert r.truncated is False and r.result == "y" * (CAP - 2) and "output cap" not in r.stderr


def test_a_python_context_drops_it_and_keeps_its_state(jail, box):
    r = run(jail, box, "keep = 41\ndef main():\n    return ['z' * 1024] * 3000\n", context_id="c1")
    assert_dropped(r)
    r = run(jail, box, "def main():\n    return keep + 1\n", context_id="c1")
    assert (r.result, r.truncated, r.exit_code) == (42, False, 0)


def test_javascript_values_over_the_cap_are_dropped(jail, box, node_available):
    if not node_available:
        pytest.skip("node is not installed")
    r = run(jail, box, "function main() { return 'x'.repeat(3 * 1024 * 1024); }", "javascript", timeout=60)
    assert_dropped(r)
    r = run(jail, box, "function main() { return 'x'.repeat(1572864); }", "javascript", timeout=60)
    assert_dropped(r, 1572864 + 2)
    # a context: the cell's completion value is the result
    r = run(jail, box, "let kept = 41; 'x'.repeat(3 * 1024 * 1024)", "javascript", timeout=60, context_id="j1")
    assert_dropped(r)
    r = run(jail, box, "kept + 1", "javascript", context_id="j1")
    assert (r.result, r.truncated, r.exit_code) == (42, False, 0)
