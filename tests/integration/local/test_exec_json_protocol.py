"""`execbox exec --json` keeps its protocol (docs/exec-json.md) whatever the host sends: a JSON
reply and exit 2 for a bad request (never a traceback), bounded stdin, and a reply whose
artifact bytes are capped, with the artifacts that do not fit reported as warnings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from execbox.cli._exec_json import ARTIFACT_BUDGET, MAX_REQUEST_BYTES

pytestmark = pytest.mark.timeout(180)
ENV = {**os.environ, "SANDBOX_TYPE": "local"}


def exec_json(stdin: bytes | str) -> tuple[int, dict, str]:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    p = subprocess.run([sys.executable, "-m", "execbox", "exec", "--json"], input=data, capture_output=True,
                       env=ENV, timeout=150)
    return p.returncode, json.loads(p.stdout), p.stderr.decode(errors="replace")


@pytest.mark.parametrize("request_, field", [
    ({"code": "print(1)", "config": "str"}, "config"),
    ({"code": "print(1)", "config": [1]}, "config"),
    ({"code": "print(1)", "provider": 123}, "provider"),
    ({"code": "print(1)", "language": ["python"]}, "language"),
    ({"code": "print(1)", "tenant_id": "../../x"}, "tenant_id"),
    ({"code": "print(1)", "tenant_id": 7}, "tenant_id"),
    ({"code": "print(1)", "include_artifact_content": "yes"}, "include_artifact_content"),
])
def test_wrong_types_are_sb002_replies_not_tracebacks(request_, field) -> None:  # noqa: ANN001
    rc, reply, stderr = exec_json(json.dumps(request_))
    assert rc == 2 and "Traceback" not in stderr
    assert reply["ok"] is False and reply["error"]["code"] == "SB002"
    assert reply["error"]["details"]["field"] == field


def test_stdin_over_the_limit_is_refused() -> None:
    body = b'{"code": "' + b"#" * MAX_REQUEST_BYTES + b'"}'
    rc, reply, _ = exec_json(body)
    assert rc == 2 and reply["ok"] is False and reply["error"]["code"] == "SB002"
    assert reply["error"]["details"] == {"field": "request", "limit": MAX_REQUEST_BYTES}


def test_artifacts_over_the_budget_are_warnings_and_the_run_keeps_its_output() -> None:
    each = ARTIFACT_BUDGET // 3 + 1  # two fit, the third does not
    code = (f"for i in range(3): open(f'artifacts/a{{i}}.bin', 'wb').write(bytes({each}))\n"
            "open('artifacts/huge.bin', 'wb').write(bytes(70 * 1024 * 1024))\n"  # past the agent's 64 MiB read
            "print('PROGRAM OUTPUT')")
    rc, reply, _ = exec_json(json.dumps({"code": code, "timeout": 60}))
    assert rc == 0 and reply["ok"] is True, reply
    assert reply["result"]["stdout"] == "PROGRAM OUTPUT\n"
    arts = {a["name"]: a for a in reply["result"]["artifacts"]}
    assert set(arts) == {"a0.bin", "a1.bin", "a2.bin", "huge.bin"}
    attached = [n for n, a in arts.items() if "content_b64" in a]
    assert sorted(attached) == ["a0.bin", "a1.bin"]
    assert sum(a["size"] for n, a in arts.items() if n in attached) <= ARTIFACT_BUDGET
    omitted = sorted(n for n, a in arts.items() if "content_omitted" in a)
    assert omitted == ["a2.bin", "huge.bin"] and len(reply["warnings"]) == 2
    assert all("not attached" in w for w in reply["warnings"])


def test_no_warnings_key_when_everything_fits() -> None:
    rc, reply, _ = exec_json(json.dumps({"code": "open('artifacts/x.txt', 'w').write('hi')"}))
    assert rc == 0 and "warnings" not in reply
    [art] = reply["result"]["artifacts"]
    assert art["content_b64"] == "aGk=" and "content_omitted" not in art
