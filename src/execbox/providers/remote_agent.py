"""Running the execbox agent inside cloud sandboxes (E2B, AgentRun) that we do not start ourselves.

The agent package is uploaded once per sandbox as a zipapp with a hash-versioned name, staged
in the workspace (``<workdir>/.execbox-agent-<sha>.pyz``: the one directory every cloud's file
API, execbox's own E2B endpoint included, can write); its first run installs it to
``/tmp/execbox-agent-<sha>/`` and removes the staged file (agent/zipapp_main.py). Each request
is a JSON file staged the same way (the agent deletes it before running anything) and one
``python3 ... oneshot`` run (agent/oneshot.py), whose stdout carries the agent's events and
reply as JSON lines. Argument/result encoding, the ``__main__`` rule, output and artifact caps,
automatic plots, path validation and error codes are therefore the agent's own: no second copy
of runner logic exists on the host.

A provider supplies a :class:`Transport` (upload files, run one argv and return its stdout); the
rest is here.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import threading
import time
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ..boxes.agent_client import agent_error
from ..errors import ProviderUnavailableError
from ..models import ExecutionResult
from .agent_result import result_from_reply
from .base import OutputCallback

AGENT_DIR = Path(__file__).resolve().parent.parent / "agent"
INSTALL_DIR = "/tmp"  # agent/zipapp_main.py's INSTALL_DIR
PYTHON = "python3"
OUTPUT_CAP = 1024 * 1024  # the agent's default: the same cap as every self-hosted provider
GRACE = 15.0  # seconds past a run's own timeout before the transport gives up on the command
FILE_OP_TIMEOUT = 60.0


class Transport(Protocol):
    """How one cloud moves files in and runs a program (its SDK's files and exec calls)."""

    def upload(self, files: dict[str, bytes]) -> None:
        """Write each absolute sandbox path -> bytes."""

    def run(self, argv: list[str], timeout: float, on_stdout: Callable[[str], None] | None) -> tuple[str, str]:
        """Run ``argv`` in the sandbox; return everything it wrote to (stdout, stderr)."""


@functools.lru_cache(maxsize=1)
def bundle() -> tuple[str, bytes]:
    """(version hash, zipapp bytes) of the agent package: its modules plus a ``__main__``."""
    buf = io.BytesIO()
    files = sorted(p for p in AGENT_DIR.iterdir() if p.suffix in (".py", ".js") and p.is_file())
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p in files:
            info = zipfile.ZipInfo(f"execbox_agent/{p.name}", date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            z.writestr(info, p.read_bytes(), zipfile.ZIP_DEFLATED)
        main = zipfile.ZipInfo("__main__.py", date_time=(2020, 1, 1, 0, 0, 0))
        z.writestr(main, (AGENT_DIR / "zipapp_main.py").read_bytes(), zipfile.ZIP_DEFLATED)
    data = buf.getvalue()
    return hashlib.sha256(data).hexdigest()[:16], data


def bundle_name() -> str:
    return f"execbox-agent-{bundle()[0]}"


def installed_path() -> str:
    """Where the agent lives in a sandbox once its first run installed it."""
    return f"{INSTALL_DIR}/{bundle_name()}"


class RemoteAgent:
    """The agent of one cloud sandbox: uploads itself on first use, then one command per request."""

    def __init__(self, transport: Transport, workspace: str, provider: str, *, runs_in_workspace: bool = False) -> None:
        """``runs_in_workspace``: the transport runs commands with the workspace as their working
        directory, so they get workspace paths relative to it. That is what works where the file
        API's path for the workspace is not the path commands see (execbox's E2B endpoint maps
        /home/user to its box's /workspace)."""
        self.transport = transport
        self.workspace = workspace.rstrip("/") or "/"
        self.provider = provider
        self.runs_in_workspace = runs_in_workspace
        self.uploaded = False
        self._install = threading.Lock()  # concurrent first requests: one uploads and installs

    def staged_path(self, name: str) -> str:
        return f"{self.workspace.rstrip('/')}/.{name}"

    def call(self, op: str, params: dict[str, Any], timeout: float = FILE_OP_TIMEOUT,
             on_output: OutputCallback | None = None) -> Any:
        """One agent request; its value, or the agent's error as the typed SB exception."""
        if self.uploaded:
            return self._call(op, params, timeout, on_output, install=False)
        with self._install:
            return self._call(op, params, timeout, on_output, install=not self.uploaded)

    def _call(self, op: str, params: dict[str, Any], timeout: float, on_output: OutputCallback | None,
              install: bool) -> Any:
        request_path = self.staged_path(f"execbox-request-{uuid.uuid4().hex}.json")
        files = {request_path: json.dumps({**params, "op": op}).encode()}
        program = installed_path()
        if install:
            program = self.staged_path(f"{bundle_name()}.pyz")
            files[program] = bundle()[1]
        self.transport.upload(files)
        argv = [PYTHON, program, "oneshot", "--workspace", self.workspace, request_path]
        if self.runs_in_workspace:
            argv = [self._relative(a) for a in argv]
        lines = _LineReader(on_output)
        stdout, stderr = self.transport.run(argv, timeout, lines.feed if on_output is not None else None)
        reply = _reply(stdout)
        self.uploaded = reply is not None  # no reply: maybe the sandbox lost /tmp; install again next time
        if reply is None:
            raise ProviderUnavailableError(
                f"{self.provider}: the agent in the sandbox gave no reply", details={
                    "provider": self.provider, "op": op, "stdout_tail": stdout[-500:],
                    "stderr_tail": stderr[-1000:]})
        if not reply.get("ok"):
            raise agent_error(reply.get("error") or {})
        return reply.get("value")

    def execute(self, params: dict[str, Any], timeout: float, metadata: dict[str, Any],
                on_output: OutputCallback | None, inline_artifacts: bool,
                fetch: Callable[[str], bytes]) -> ExecutionResult:
        """An ``exec`` request mapped exactly like a self-hosted box's reply."""
        request = {**params, "timeout": timeout, "output_cap": OUTPUT_CAP, "stream": on_output is not None,
                   "inline_artifacts": inline_artifacts}
        started = time.monotonic()
        value = self.call("exec", request, timeout + GRACE, on_output)
        return result_from_reply(value, metadata, oom=False, wall=time.monotonic() - started, fetch=fetch)


    def _relative(self, path: str) -> str:
        if path == self.workspace:
            return "."
        if path.startswith(self.workspace + "/"):
            return "./" + path[len(self.workspace) + 1:]
        return path


class _LineReader:
    """Stream the agent's output events while the command runs (stdout arrives in chunks)."""

    def __init__(self, on_output: OutputCallback | None) -> None:
        self.on_output = on_output
        self.buf = ""

    def feed(self, chunk: str) -> None:
        self.buf += chunk
        *complete, self.buf = self.buf.split("\n")
        for line in complete:
            msg = _parse(line)
            if msg and self.on_output is not None and msg.get("event") in ("stdout", "stderr"):
                self.on_output(msg["event"], str(msg.get("data", "")))


def _parse(line: str) -> dict[str, Any] | None:
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


def _reply(stdout: str) -> dict[str, Any] | None:
    """The last line that is a reply (events come before it)."""
    for line in reversed(stdout.splitlines()):
        msg = _parse(line.strip())
        if msg is not None and "ok" in msg:
            return msg
    return None


def shell_quote(argv: list[str]) -> str:
    """argv as one POSIX shell command (for exec APIs that take a string); every element quoted."""
    import shlex

    return " ".join(shlex.quote(a) for a in argv)


def python_cell(argv: list[str]) -> str:
    """A notebook cell that runs ``argv`` and prints its stdout (for clouds that only run cells)."""
    return ("import subprocess as _s, sys as _y\n"
            f"_p = _s.run({argv!r}, stdin=_s.DEVNULL, stdout=_s.PIPE)\n"
            "_y.stdout.write(_p.stdout.decode('ascii', 'replace'))\n"
            "_y.stdout.flush()\n")


__all__ = ["RemoteAgent", "Transport", "bundle", "installed_path", "python_cell", "shell_quote"]
