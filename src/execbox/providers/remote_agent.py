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

from ..agent import SHIPPED_SUFFIXES
from ..boxes.agent_client import agent_error, reply_frame_limit
from ..errors import InvalidConfigError, ProviderUnavailableError, SandboxError
from ..models import ExecutionResult, Language
from .agent_result import result_from_reply
from .base import OutputCallback, check_run_inputs, check_timeout
from .output_cap import OUTPUT_CAP, cap_text

AGENT_DIR = Path(__file__).resolve().parent.parent / "agent"
INSTALL_DIR = "/tmp"  # agent/zipapp_main.py's INSTALL_DIR
PYTHON = "python3"
GRACE = 15.0  # seconds past a run's own timeout before the transport gives up on the command
FILE_OP_TIMEOUT = 60.0
EVENT_LINE_CAP = 1024 * 1024
"""The longest output event line streamed on (the agent's are at most ~400 KiB: a 64 KiB read,
JSON-escaped); a longer line is skipped as it arrives, never buffered. Tenant code can replace the
agent in a cloud sandbox, so nothing it prints is trusted to be well-formed or small."""


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
    files = sorted(p for p in AGENT_DIR.iterdir() if p.suffix in SHIPPED_SUFFIXES and p.is_file())
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


class AgentRunsMixin:
    """``execute_code`` and ``run_command`` of a cloud provider whose sandbox runs execbox's agent:
    checked here, then one agent call (``_exec``); contexts are not mapped onto a cloud sandbox yet."""

    def _exec(self, instance_id: str, params: dict[str, Any], timeout: float, on_output: OutputCallback | None,
              inline_artifacts: bool) -> ExecutionResult:
        raise NotImplementedError

    def _check_hard_limit(self, timeout: float) -> None:
        """A vendor's own ceiling on one call (none by default)."""

    def execute_code(self, instance_id: str, code: str, language: str, timeout: int = 10,
                     arguments: dict[str, Any] | None = None, *, context_id: str | None = None,
                     on_output: OutputCallback | None = None,
                     inline_artifacts: bool = False) -> ExecutionResult:
        lang = Language.parse(language)
        check_run_inputs(code, arguments, timeout)
        if context_id is not None:
            raise self._unsupported("stateful contexts (context_id)")  # type: ignore[attr-defined]
        self._check_hard_limit(timeout)
        return self._exec(instance_id, {"language": lang.value, "code": code, "arguments": arguments},
                          float(timeout), on_output, inline_artifacts)

    def run_command(self, instance_id: str, command: str, timeout: int = 30, *, cwd: str | None = None,
                    env: dict[str, str] | None = None, on_output: OutputCallback | None = None) -> ExecutionResult:
        """A shell command through the agent's bash (the vendor's own command API only starts the agent)."""
        if not isinstance(command, str) or not command.strip():
            raise InvalidConfigError("command must be a non-empty string", details={"field": "command"})
        check_timeout(timeout)
        self._check_hard_limit(timeout)
        return self._exec(instance_id, {"language": "bash", "code": command, "cwd": cwd, "env": env or {}},
                          float(timeout), on_output, False)


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
        reply = _reply(stdout, reply_frame_limit(op, params), self.provider)
        self.uploaded = reply is not None  # no reply: maybe the sandbox lost /tmp; install again next time
        if reply is None:
            raise ProviderUnavailableError(
                f"{self.provider}: the agent in the sandbox gave no reply", details={
                    "provider": self.provider, "op": op, "stdout_tail": stdout[-500:],
                    "stderr_tail": stderr[-1000:]})
        if not reply.get("ok"):
            raise _agent_error(reply.get("error"), self.provider)
        return reply.get("value")

    def execute(self, params: dict[str, Any], timeout: float, metadata: dict[str, Any],
                on_output: OutputCallback | None, inline_artifacts: bool,
                fetch: Callable[[str], bytes]) -> ExecutionResult:
        """An ``exec`` request mapped exactly like a self-hosted box's reply."""
        request = {**params, "timeout": timeout, "output_cap": OUTPUT_CAP, "stream": on_output is not None,
                   "inline_artifacts": inline_artifacts}
        started = time.monotonic()
        value = self.call("exec", request, timeout + GRACE, on_output)
        if not isinstance(value, dict):
            raise ProviderUnavailableError(f"{self.provider}: the agent's exec reply is not an object",
                                           details={"provider": self.provider})
        result = result_from_reply(value, metadata, oom=False, wall=time.monotonic() - started, fetch=fetch)
        return _capped(result)


    def _relative(self, path: str) -> str:
        if path == self.workspace:
            return "."
        if path.startswith(self.workspace + "/"):
            return "./" + path[len(self.workspace) + 1:]
        return path


def _agent_error(err: Any, provider: str) -> SandboxError:
    """The agent's error reply as its SB exception, its fields checked first (the agent in a cloud
    sandbox may not be ours: a malformed error is SB009, never a TypeError)."""
    if not isinstance(err, dict):
        return ProviderUnavailableError(f"{provider}: the agent replied with a malformed error",
                                        details={"provider": provider})
    status, details = err.get("status"), err.get("details")
    return agent_error({"code": str(err.get("code") or ""), "message": str(err.get("message") or "agent error")[:4096],
                        "details": details if isinstance(details, dict) else {},
                        "status": status if isinstance(status, int) and not isinstance(status, bool) else None})


def _capped(result: ExecutionResult) -> ExecutionResult:
    """The output cap the agent was asked for, enforced here too: the agent may not be ours."""
    if not isinstance(result.stdout, str) or not isinstance(result.stderr, str):
        raise ProviderUnavailableError("the agent's exec reply has output that is not text",
                                       details={"field": "stdout/stderr"})
    result.stdout, cut_out = cap_text(result.stdout, OUTPUT_CAP)
    result.stderr, cut_err = cap_text(result.stderr, OUTPUT_CAP)
    result.truncated = result.truncated or cut_out or cut_err
    return result


class _LineReader:
    """Stream the agent's output events while the command runs (stdout arrives in chunks); a line
    over EVENT_LINE_CAP is dropped as it arrives, and at most OUTPUT_CAP characters of each stream
    are passed on."""

    def __init__(self, on_output: OutputCallback | None) -> None:
        self.on_output = on_output
        self.buf: list[str] = []
        self.size = 0
        self.skipping = False  # inside a line over the cap: drop until its end
        self.sent = {"stdout": 0, "stderr": 0}

    def feed(self, chunk: str) -> None:
        *ends, rest = chunk.split("\n")
        for end in ends:
            if not self.skipping:
                self._line("".join([*self.buf, end]))
            self.buf, self.size, self.skipping = [], 0, False
        if rest and not self.skipping:
            self.buf.append(rest)
            self.size += len(rest)
            if self.size > EVENT_LINE_CAP:
                self.buf, self.size, self.skipping = [], 0, True

    def _line(self, line: str) -> None:
        if len(line) > EVENT_LINE_CAP:
            return
        msg = _parse(line)
        stream = msg.get("event") if msg else None
        if msg is None or self.on_output is None or stream not in self.sent:
            return
        room = OUTPUT_CAP - self.sent[stream]
        text = str(msg.get("data", ""))[: max(room, 0)]
        if text:
            self.sent[stream] += len(text)
            self.on_output(stream, text)


def _parse(line: str) -> dict[str, Any] | None:
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


def _reply(stdout: str, limit: int, provider: str) -> dict[str, Any] | None:
    """The last line that is a reply (events come before it), read from the end without copying
    the whole output; a line longer than ``limit`` (no reply of ours is) is refused, not parsed."""
    end = len(stdout)
    while end > 0:
        start = stdout.rfind("\n", 0, end) + 1
        if end - start > limit:
            raise ProviderUnavailableError(
                f"{provider}: the agent's output has a line longer than the {limit}-byte reply limit; refused",
                details={"provider": provider, "limit_bytes": limit})
        msg = _parse(stdout[start:end].strip())
        if msg is not None and "ok" in msg:
            return msg
        end = start - 1
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
