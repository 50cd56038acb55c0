"""The agent as uploaded into cloud sandboxes: the zipapp bundle, the one-shot entry, the host side.

A local subprocess transport stands in for a cloud's exec API, so these run without any cloud or
fake server: they pin what every cloud provider gets, whatever its SDK.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from execbox.errors import PathError, ProviderUnavailableError
from execbox.providers import remote_agent
from execbox.providers.cloud_errors import is_connect_error, mask_secrets
from execbox.providers.remote_agent import RemoteAgent, bundle, installed_path, python_cell, shell_quote
from tests.conftest import require

from .fake_e2b import HOME, map_sandbox_path, sandbox_argv


class LocalTransport:
    """A local sandbox: bubblewrap with a home at /home/user and its own /tmp, like a cloud VM."""

    def __init__(self, root: Path) -> None:
        self.home, self.tmp = root / "home", root / "tmp"
        self.home.mkdir()
        self.tmp.mkdir()
        self.uploads: list[str] = []
        self.runs = 0

    def upload(self, files: dict[str, bytes]) -> None:
        for path, data in files.items():
            self.uploads.append(path)
            local = map_sandbox_path({HOME: str(self.home), "/tmp": str(self.tmp)}, path)
            assert local is not None, path
            Path(local).write_bytes(data)

    def run(self, argv: list[str], timeout: float, on_stdout: Callable[[str], None] | None) -> tuple[str, str]:
        self.runs += 1
        p = subprocess.run(sandbox_argv(str(self.home), str(self.tmp), argv), capture_output=True, text=True,
                           timeout=timeout, env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"})
        out = p.stdout
        if on_stdout is not None:
            for i in range(0, len(out), 7):  # in odd chunks, as a streaming exec API delivers them
                on_stdout(out[i:i + 7])
        return out, p.stderr


@pytest.fixture
def agent(tmp_path: Path) -> RemoteAgent:
    require(shutil.which("bwrap") is not None, "bwrap")
    return RemoteAgent(LocalTransport(tmp_path), HOME, "test")


def _exec(agent: RemoteAgent, code: str, language: str = "python", **kw):
    return agent.execute({"language": language, "code": code, "arguments": kw.pop("arguments", None)},
                         kw.pop("timeout", 10.0), {"provider": "test"}, kw.pop("on_output", None), True,
                         lambda path: b"")


def test_bundle_is_the_agent_package_and_versioned_by_its_hash():
    digest, data = bundle()
    assert installed_path() == f"/tmp/execbox-agent-{digest}"
    with zipfile.ZipFile(__import__("io").BytesIO(data)) as z:
        names = set(z.namelist())
    agent_dir = Path(remote_agent.AGENT_DIR)
    expected = {f"execbox_agent/{p.name}" for p in agent_dir.iterdir() if p.suffix in (".py", ".js", ".mjs")}
    assert names == expected | {"__main__.py"} and "execbox_agent/js_esm_hooks.mjs" in names
    assert bundle() == (digest, data)  # built once, identical every time (fixed zip timestamps)


def test_uploaded_once_installed_in_tmp_and_the_workspace_left_clean(agent):
    transport = agent.transport
    for i in range(3):
        assert _exec(agent, f"print({i})").stdout == f"{i}\n"
    pyz = [u for u in transport.uploads if u.endswith(".pyz")]
    assert pyz == [f"{HOME}/.execbox-agent-{bundle()[0]}.pyz"] and transport.runs == 3
    assert {"__main__.py", "execbox_agent"} <= set(os.listdir(transport.tmp / installed_path().split("/")[-1]))
    assert sorted(os.listdir(transport.home)) == ["artifacts"]  # staged archive and requests removed


def test_a_sandbox_that_lost_the_agent_gets_it_again(agent):
    assert _exec(agent, "print(1)").stdout == "1\n"
    shutil.rmtree(agent.transport.tmp / installed_path().split("/")[-1])
    with pytest.raises(ProviderUnavailableError, match="gave no reply"):
        _exec(agent, "print(2)")
    assert _exec(agent, "print(3)").stdout == "3\n"


def test_results_are_the_agents_own(agent):
    r = _exec(agent, "def main(a, b):\n    print('adding')\n    return {'sum': a + b}\n", arguments={"a": 1, "b": 2})
    assert (r.stdout, r.result, r.metadata["result_type"]) == ("adding\n", {"sum": 3}, "dict")
    r = _exec(agent, "def main():\n    return object()\n")
    assert r.exit_code == 1 and "not JSON-serializable" in r.stderr
    r = _exec(agent, "def main():\n    return 1\nif __name__ == '__main__':\n    print('script')\n")
    assert r.stdout == "script\n" and r.metadata["result_present"] is False
    r = _exec(agent, "import sys\nsys.stdout.buffer.write(b'\\xff ok\\n')")
    assert r.stdout == "\ufffd ok\n"
    r = _exec(agent, "import sys\nsys.stdout.write('x' * (2 * 1024 * 1024))")
    assert r.truncated and len(r.stdout) == remote_agent.OUTPUT_CAP
    r = _exec(agent, "open('artifacts/a.txt', 'w').write('hi')")
    assert [(a.name, a.read_bytes()) for a in r.artifacts] == [("a.txt", b"hi")]
    r = _exec(agent, "import time\ntime.sleep(5)", timeout=0.5)
    assert r.timed_out and r.error_code == "SB005"


def test_user_output_cannot_forge_the_reply(agent):
    fake = json.dumps({"id": 1, "ok": True, "value": {"stdout": "forged", "exit_code": 0}})
    r = _exec(agent, f"print({fake!r})\nraise SystemExit(4)")
    assert r.exit_code == 4 and r.stdout == fake + "\n"


def test_output_streams_as_it_arrives(agent):
    seen: list[tuple[str, str]] = []
    r = _exec(agent, "import sys\nprint('a', flush=True)\nprint('b', file=sys.stderr)",
              on_output=lambda name, text: seen.append((name, text)))
    assert r.stdout == "a\n"
    assert ("stdout", "a\n") in seen and ("stderr", "b\n") in seen


def test_agent_errors_are_typed_and_a_missing_reply_is_sb009(agent):
    with pytest.raises(PathError):
        agent.call("files.read_bytes", {"path": "../etc/passwd"})

    class Silent(LocalTransport):
        def run(self, argv, timeout, on_stdout):
            return "not json\n", "python3: oops\n"

    root = agent.transport.tmp.parent / "silent"
    root.mkdir()
    silent = RemoteAgent(Silent(root), agent.workspace, "test")
    with pytest.raises(ProviderUnavailableError, match="gave no reply") as e:
        silent.call("ping", {})
    assert e.value.details["stderr_tail"] == "python3: oops\n"


def test_javascript_and_bash_run_through_the_agent(agent):
    require(shutil.which("node") is not None, "node")
    r = _exec(agent, "function main(args) { return args.n * 2 }", "javascript", arguments={"n": 21})
    assert r.result == 42
    assert _exec(agent, "echo hi; exit 7", "bash").exit_code == 7


def test_argv_encodings_quote_every_element():
    argv = ["python3", "/tmp/a b.pyz", "oneshot", "--workspace", "/home/user", "/tmp/x';rm -rf /"]
    assert shell_quote(argv) == "python3 '/tmp/a b.pyz' oneshot --workspace /home/user '/tmp/x'\"'\"';rm -rf /'"
    cell = python_cell(argv)
    assert repr(argv) in cell
    compile(cell, "<cell>", "exec")


def test_mask_secrets_and_connect_error_detection():
    assert mask_secrets("key e2b_abcdef123456 failed", ["e2b_abcdef123456"]) == "key ****3456 failed"
    # a short secret is masked where it stands alone, not inside other words (redaction.scrub)
    assert mask_secrets("a message about a, abc", ["a"]) == "**** message about ****, abc"
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as inner:
            raise RuntimeError("Unretryable: request failed") from inner
    except RuntimeError as e:
        assert is_connect_error(e)
    assert not is_connect_error(ValueError("bad template"))
