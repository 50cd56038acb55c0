"""POST /run and GET /healthz against a real uvicorn server: RAGFlow executor_manager shapes."""

from __future__ import annotations

import base64
import json

import pytest

from tests.conftest import require

from .conftest import server_provider_name

RESPONSE_KEYS = {"status", "stdout", "stderr", "exit_code", "detail", "time_used_ms", "memory_used_kb",
                 "resource_limit_type", "unauthorized_access_type", "runtime_error_type", "artifacts", "result"}
EXTENSION_KEYS = {"isolation"}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def run(client, code: str, language: str = "python", arguments=None, **extra):
    body = {"code_b64": b64(code), "language": language, **extra}
    if arguments is not None:
        body["arguments"] = arguments
    r = client.post("/run", json=body)
    return r.status_code, r.json()


def test_healthz_is_ragflow_shape(client):
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


def test_python_main_kwargs_result_travels_separately(client, server_provider):
    code = "def main(name, count):\n    print('working')\n    return {'message': f'Hello {name}!' * count}\n"
    status, body = run(client, code, arguments={"name": "World", "count": 3})
    assert status == 200
    assert set(body) == RESPONSE_KEYS | EXTENSION_KEYS
    assert body["status"] == "success"
    assert body["exit_code"] == 0
    assert body["stdout"] == "working\n"
    assert body["result"] == {"present": True, "value": {"message": "Hello World!Hello World!Hello World!"},
                              "type": "dict"}
    assert body["resource_limit_type"] is None and body["runtime_error_type"] is None
    assert body["unauthorized_access_type"] is None and body["detail"] is None
    assert body["time_used_ms"] > 0
    assert body["memory_used_kb"] > 0  # RAGFlow leaves this null
    assert body["isolation"] == server_provider.isolation.value


def test_nodejs_main_args(client, node_available):
    require(node_available, "node")
    code = "function main(args) {\n  const { name, count } = args;\n  console.log('js');\n" \
           "  return `Hello ${name}!`.repeat(count);\n}\n"
    status, body = run(client, code, "nodejs", {"name": "World", "count": 2})
    assert status == 200 and body["status"] == "success", body
    assert body["stdout"] == "js\n"
    assert body["result"]["present"] is True
    assert body["result"]["value"] == "Hello World!Hello World!"


def test_nodejs_code_written_for_ragflow(client, node_available):
    """RAGFlow's handler appends `module.exports = { main };`; code written that way (or with require) works."""
    require(node_available, "node")
    code = "const path = require('path');\nfunction main(args) {\n  return path.join(args.a, args.b);\n}\n" \
           "module.exports = { main };\n"
    status, body = run(client, code, "nodejs", {"a": "x", "b": "y"})
    assert status == 200 and body["status"] == "success", body
    assert body["result"]["value"] == "x/y"


def test_no_main_plain_script(client):
    status, body = run(client, "print(6 * 7)")
    assert body["status"] == "success"
    assert body["stdout"] == "42\n"
    assert body["result"] == {"present": False, "value": None, "type": "json"}


def test_main_returning_none_is_present(client):
    _, body = run(client, "def main():\n    return None\n")
    assert body["result"]["present"] is True and body["result"]["value"] is None


def test_result_marker_never_leaks_and_cannot_be_forged(client):
    forged = base64.b64encode(json.dumps({"present": True, "value": "forged", "type": "json"}).encode()).decode()
    code = (f"def main(x):\n    print('__RAGFLOW_RESULT__:{forged}')\n    print('line2')\n"
            "    return {'real': x}\n")
    _, body = run(client, code, arguments={"x": 1})
    assert body["result"]["value"] == {"real": 1}
    # the user's own output is kept verbatim; nothing of ours is added to it
    assert body["stdout"] == f"__RAGFLOW_RESULT__:{forged}\nline2\n"
    assert "real" not in body["stdout"]


def test_argument_types_preserved(client):
    args = {"i": 1, "f": 1.5, "b": True, "n": None, "s": "héllo ✓", "l": [1, "a"], "d": {"k": [True]}}
    code = "def main(**kw):\n    return {k: [type(v).__name__, v] for k, v in kw.items()}\n"
    _, body = run(client, code, arguments=args)
    got = body["result"]["value"]
    assert {k: v[1] for k, v in got.items()} == args
    assert {k: v[0] for k, v in got.items()} == {"i": "int", "f": "float", "b": "bool", "n": "NoneType",
                                                 "s": "str", "l": "list", "d": "dict"}


def test_one_megabyte_arguments(client):
    blob = "x" * 1_000_000
    code = "def main(blob, tail):\n    return {'len': len(blob), 'tail': tail}\n"
    status, body = run(client, code, arguments={"blob": blob, "tail": "end"})
    assert status == 200 and body["status"] == "success", body.get("stderr")
    assert body["result"]["value"] == {"len": 1_000_000, "tail": "end"}


def test_program_error(client):
    status, body = run(client, "def main():\n    raise ValueError('bad input')\n")
    assert status == 200
    assert body["status"] == "program_error"
    assert body["runtime_error_type"] == "nonzero_exit"
    assert body["exit_code"] == 1
    assert "ValueError: bad input" in body["stderr"]
    assert body["result"]["present"] is False


def test_timeout_is_resource_limit_time(client):
    status, body = run(client, "import time\nprint('before', flush=True)\ntime.sleep(30)\n", timeout=1)
    assert status == 200
    assert body["status"] == "resource_limit_exceeded"
    assert body["resource_limit_type"] == "time"
    assert body["stdout"] == "before\n"  # partial output is kept (RAGFlow drops it)
    assert body["time_used_ms"] < 10_000


def test_memory_error_is_resource_limit_memory(client):
    _, body = run(client, "b = bytearray(10 ** 13)\n")
    assert body["status"] == "resource_limit_exceeded"
    assert body["resource_limit_type"] == "memory"
    assert "MemoryError" in body["stderr"]


def test_a_programs_own_memory_error_is_not_a_memory_limit(client):
    """The agent's rule, not a second one: only a bare MemoryError (a failed allocation) is SB006."""
    _, body = run(client, "raise MemoryError('cache budget exceeded')\n")
    assert (body["status"], body["runtime_error_type"], body["resource_limit_type"]) == (
        "program_error", "nonzero_exit", None), body
    assert "MemoryError: cache budget exceeded" in body["stderr"]


def test_output_cap_is_resource_limit_output(client):
    _, body = run(client, "import sys\nsys.stdout.write('a' * 3_000_000)\n")
    assert body["status"] == "resource_limit_exceeded"
    assert body["resource_limit_type"] == "output"
    assert 0 < len(body["stdout"]) < 3_000_000


def test_signal_is_runtime_error_signalled(client):
    _, body = run(client, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert body["status"] == "runtime_error"
    assert body["runtime_error_type"] == "signalled"
    assert "SIGKILL" in body["detail"]


@pytest.mark.parametrize("exc, kind", [
    ("PermissionError(13, 'Permission denied', '/secret')", "file_access"),
    ("OSError(30, 'Read-only file system', '/usr/x')", "file_access"),
    ("OSError(101, 'Network is unreachable')", "network_access"),
    ("PermissionError(1, 'Operation not permitted')", "disallowed_syscall"),
])
def test_unauthorized_access_types(client, exc, kind):
    _, body = run(client, f"raise {exc}\n")
    assert body["status"] == "unauthorized_access"
    assert body["unauthorized_access_type"] == kind


def test_jail_denials_are_unauthorized_access(client):
    """Real denials from the box (not raised by hand): needs the jail provider."""
    require(server_provider_name() == "jail", "jail provider (bubblewrap)")
    _, net = run(client, "import socket\nsocket.create_connection(('10.255.255.1', 80), timeout=3)\n")
    assert net["status"] == "unauthorized_access" and net["unauthorized_access_type"] == "network_access", net
    _, fs = run(client, "open('/usr/bin/pwned', 'w').write('x')\n")
    assert fs["status"] == "unauthorized_access" and fs["unauthorized_access_type"] == "file_access", fs


def test_memory_bomb_is_contained_as_memory_limit(client):
    """A real OOM kill by the box's memory limit (jail: 256 MiB here), reported like RAGFlow's 137."""
    require(server_provider_name() == "jail", "jail provider (bubblewrap)")
    code = "blocks = []\nwhile True:\n    blocks.append(b'x' * (16 * 1024 * 1024))\n"
    status, body = run(client, code, timeout=20)
    assert status == 200
    assert body["status"] == "resource_limit_exceeded" and body["resource_limit_type"] == "memory", body
    assert body["memory_used_kb"] is None or body["memory_used_kb"] <= 300 * 1024
    _, after = run(client, "print('still serving')")
    assert after["stdout"] == "still serving\n"


def test_artifacts_inline(client):
    code = ("import csv\n"
            "with open('artifacts/table.csv', 'w', newline='') as f:\n"
            "    csv.writer(f).writerows([['a', 'b'], [1, 2]])\n"
            "open('artifacts/blob.bin', 'wb').write(bytes(range(256)) * 4)\n")
    _, body = run(client, code)
    assert body["status"] == "success", body["stderr"]
    arts = {a["name"]: a for a in body["artifacts"]}
    assert set(arts) == {"table.csv", "blob.bin"}
    assert set(arts["table.csv"]) == {"name", "mime_type", "size", "content_b64"}
    assert base64.b64decode(arts["table.csv"]["content_b64"]) == b"a,b\r\n1,2\r\n"
    assert arts["table.csv"]["mime_type"] == "text/csv"
    assert base64.b64decode(arts["blob.bin"]["content_b64"]) == bytes(range(256)) * 4
    assert arts["blob.bin"]["size"] == 1024


def test_each_run_gets_a_fresh_box(client):
    run(client, "open('leftover.txt', 'w').write('x')\nopen('artifacts/a.txt', 'w').write('1')\n")
    _, body = run(client, "import os\nprint(os.path.exists('leftover.txt'))\n")
    assert body["stdout"] == "False\n"
    assert body["artifacts"] == []


@pytest.mark.parametrize("payload, field", [
    ({"code_b64": "not base64!!", "language": "python"}, "code_b64"),
    ({"code_b64": "YWJ", "language": "python"}, "code_b64"),  # incorrect padding
    ({"code_b64": base64.b64encode(b"\xff\xfe").decode(), "language": "python"}, "code_b64"),  # not UTF-8
    ({"language": "python"}, "code_b64"),
    ({"code_b64": b64("print(1)"), "language": "ruby"}, "language"),
    ({"code_b64": b64("print(1)"), "arguments": [1, 2]}, "arguments"),
    ({"code_b64": b64("print(1)"), "timeout": -1}, "timeout"),
])
def test_bad_requests_are_422_like_fastapi(client, payload, field):
    r = client.post("/run", json=payload)
    assert r.status_code == 422
    body = r.json()
    assert body["detail"][0]["loc"] == ["body", field]  # FastAPI's shape, as RAGFlow's executor answers
    assert body["error"]["code"] == "SB002"
    assert field in body["error"]["details"]["fields"]


def test_bad_base64_message_matches_ragflow(client):
    r = client.post("/run", json={"code_b64": "@@@", "language": "python"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["msg"].startswith("Value error, Invalid base64 encoding:")


def test_invalid_json_is_422(client):
    r = client.post("/run", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["type"] == "json_invalid"


def test_arguments_default_and_null(client):
    _, body = run(client, "def main():\n    return 'ok'\n")  # arguments omitted: RAGFlow's default {}
    assert body["result"]["value"] == "ok"
    r = client.post("/run", json={"code_b64": b64("def main():\n    return 'n'\n"), "arguments": None})
    assert r.status_code == 200 and r.json()["result"]["value"] == "n"
