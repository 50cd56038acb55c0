"""The execbox CLI as a user runs it: a real subprocess, real exit codes, real JSON."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)
EXECBOX = [sys.executable, "-m", "execbox"]
ENV = {**os.environ, "SANDBOX_TYPE": "local"}


def cli(*args, stdin=""):
    return subprocess.run([*EXECBOX, *args], input=stdin, capture_output=True, text=True, env=ENV, timeout=90)


def test_run_file_with_args(tmp_path):
    f = tmp_path / "prog.py"
    f.write_text("def main(n):\n    print('n is', n)\n    return {'double': n * 2}\n")
    p = cli("run", str(f), "--args", '{"n": 4}')
    assert p.returncode == 0, p.stderr
    assert p.stdout == "n is 4\n"
    assert 'result: {"double": 8}' in p.stderr


def test_run_stdin_language_and_exit_code():
    p = cli("run", "-", "--language", "bash", stdin="echo hi; exit 5")
    assert (p.returncode, p.stdout) == (5, "hi\n")


def test_run_timeout_exit_124():
    p = cli("run", "-", "--timeout", "1s", stdin="import time\ntime.sleep(30)")
    assert p.returncode == 124 and "SB005" in p.stderr


def test_run_bad_input_is_sb002_exit_2(tmp_path):
    p = cli("run", "-", "--args", "[1]", stdin="print(1)")
    assert p.returncode == 2 and "SB002" in p.stderr
    p = cli("run", str(tmp_path / "missing.py"))
    assert p.returncode == 2 and "no such file" in p.stderr
    p = cli("run", "-", "--timeout", "soon", stdin="print(1)")
    assert p.returncode == 2 and "not a duration" in p.stderr


def test_exec_json_roundtrip():
    req = {"code": "def main(a, b):\n    open('artifacts/x.txt','w').write('hi')\n    return a + b",
           "arguments": {"a": 1, "b": 2}, "files": {"in.txt": "data"}, "timeout": "10s"}
    p = cli("exec", "--json", stdin=json.dumps(req))
    assert p.returncode == 0, p.stderr
    reply = json.loads(p.stdout)
    assert reply["ok"] is True
    res = reply["result"]
    assert res["result"] == 3 and res["exit_code"] == 0
    [art] = res["artifacts"]
    assert art["name"] == "x.txt" and art["content_b64"] == "aGk="
    assert res["metadata"]["provider"] == "local"


@pytest.mark.parametrize("stdin,field", [
    ("not json", "request"),
    ('{"code": 1}', "code"),
    ('{"code": "x", "arguments": [1]}', "arguments"),
    ('{"code": "x", "timeout": "soon"}', "timeout"),
])
def test_exec_json_errors(stdin, field):
    p = cli("exec", "--json", stdin=stdin)
    assert p.returncode == 2
    reply = json.loads(p.stdout)
    assert reply["ok"] is False and reply["error"]["code"] == "SB002"
    assert reply["error"]["details"].get("field") == field


def test_exec_json_rejects_unknown_fields():
    p = cli("exec", "--json", stdin='{"code": "print(1)", "lang": "python"}')
    reply = json.loads(p.stdout)
    assert p.returncode == 2 and "lang" in reply["error"]["details"]["fields"]


def test_doctor_json_reports_tiers():
    p = subprocess.run([*EXECBOX, "doctor", "--json", "--no-probe"], capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["providers"]["local"]["usable"] is True
    assert report["providers"]["local"]["tier"] == "none"
    assert "local" in report["tiers"]["none"]
    assert report["zero_config"]["provider"] in report["providers"]
    for name, info in report["providers"].items():
        assert "usable" in info and "reason" in info, name
