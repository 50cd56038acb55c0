"""The wrapper cloud interpreters run: real python3/node executions of the wrapped code."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from execbox.providers.remote_code import (
    MARK_PREFIX,
    extract_result,
    is_connect_error,
    mask_secrets,
    new_marker,
    wrap_javascript,
    wrap_python,
)
from tests.conftest import require


def run_py(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-"], input=code, cwd=cwd, capture_output=True, text=True,
                          timeout=30)


def test_markers_are_unpredictable():
    assert len({new_marker() for _ in range(100)}) == 100


def test_forged_marker_stays_in_stdout_and_cannot_replace_the_result(tmp_path):
    mark = new_marker()
    forged = f'{MARK_PREFIX}0000000000000000__:{{"present": true, "value": "forged"}}'
    p = run_py(wrap_python(f"def main():\n    print({forged!r})\n    return 'real'\n", None, mark), tmp_path)
    stdout, payload = extract_result(p.stdout, mark)
    assert payload["value"] == "real"
    assert stdout == forged + "\n"


def test_payload_reported_even_when_main_raises_and_lines_match_user_code(tmp_path):
    mark = new_marker()
    p = run_py(wrap_python("import os\n\ndef main(k):\n    open('artifacts/partial.txt', 'w').write('x')\n"
                           "    raise RuntimeError('late')\n", {"k": 1}, mark), tmp_path)
    stdout, payload = extract_result(p.stdout, mark)
    assert stdout == "" and payload["present"] is False
    assert payload["artifacts"] == ["partial.txt"]
    assert 'File "<code>", line 5, in main' in p.stderr


def test_non_json_result_is_an_error_not_a_silent_repr(tmp_path):
    mark = new_marker()
    p = run_py(wrap_python("def main():\n    return object()\n", None, mark), tmp_path)
    _, payload = extract_result(p.stdout, mark)
    assert p.returncode != 0 and "not JSON serializable" in p.stderr
    assert payload["present"] is False


def test_unchanged_artifacts_are_not_reported_again(tmp_path):
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "old.txt").write_text("o")
    mark = new_marker()
    p = run_py(wrap_python("open('artifacts/new.txt', 'w').write('n')\n", None, mark), tmp_path)
    assert extract_result(p.stdout, mark)[1]["artifacts"] == ["new.txt"]


@pytest.mark.parametrize("stdout, expected", [
    ("", ""), ("a", "a"), ("a\n", "a\n"), ("a\nb\n", "a\nb\n"),
])
def test_extract_keeps_user_output_exactly(stdout, expected):
    mark = new_marker()
    text = stdout + "\n" + mark + '{"present": true, "value": 1}\n'
    assert extract_result(text, mark) == (expected, {"present": True, "value": 1})
    assert extract_result(stdout, mark) == (stdout, None)


def test_javascript_async_main_and_no_main(tmp_path):
    require(shutil.which("node") is not None, "node")
    mark = new_marker()
    p = subprocess.run(["node", "-"], input=wrap_javascript(
        "async function main(a) { await new Promise(r => setTimeout(r, 10)); return {v: a.v} }", {"v": 7}, mark),
        capture_output=True, text=True, timeout=30)
    assert extract_result(p.stdout, mark) == ("", {"present": True, "value": {"v": 7}, "type": "object",
                                                   "artifacts": []})
    p = subprocess.run(["node", "-"], input=wrap_javascript("console.log('plain')", None, mark),
                       capture_output=True, text=True, timeout=30)
    assert extract_result(p.stdout, mark)[0] == "plain\n"
    assert extract_result(p.stdout, mark)[1]["present"] is False


def test_e2b_ignores_artifact_names_that_escape(monkeypatch):
    from execbox.providers.e2b import E2BProvider

    p = E2BProvider()
    p.initialize({"api_key": "e2b_x"})
    reads = []

    class Files:
        def read(self, path, format="text"):
            reads.append(path)
            return b"ok"

    class Sb:
        files = Files()

    arts = p._artifacts(Sb(), ["../../etc/passwd", "/abs", "fine.txt"], [])
    assert [a.name for a in arts] == ["fine.txt"]
    assert reads == ["/home/user/artifacts/fine.txt"]


def test_mask_secrets_and_connect_error_detection():
    assert mask_secrets("key e2b_abcdef123456 failed", ["e2b_abcdef123456"]) == "key ...3456 failed"
    assert mask_secrets("a message about a", ["a"]) == "a message about a"  # too short to be a real secret
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as inner:
            raise RuntimeError("Unretryable: request failed") from inner
    except RuntimeError as e:
        assert is_connect_error(e)
    assert not is_connect_error(ValueError("bad template"))
