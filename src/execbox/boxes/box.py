"""Host handle of one running box: an agent connection plus how to limit and kill it.

Backends subclass ``Box`` with their own start/kill; everything about running code goes
through ``client`` to the in-box agent.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
from typing import Any

from .agent_client import AgentClient, PipeTransport

log = logging.getLogger("execbox.box")

AGENT_BOOT = (
    "import sys;sys.path.insert(0,sys.argv[1]);"
    "import importlib;importlib.import_module(sys.argv[2]).main(sys.argv[3:])"
)
"""Bootstrap passed to ``python -I -c``: a constant, never built from user input."""

READY_TIMEOUT = 60.0


def agent_source_dir() -> str:
    """Directory of the agent package (mounted read-only into boxes)."""
    from .. import agent

    return os.path.dirname(os.path.abspath(agent.__file__))


class Box:
    """A started box whose main process is the agent."""

    isolation = "none"

    def __init__(self, name: str, client: AgentClient, workspace: str | None, limits: dict[str, Any]) -> None:
        self.name = name
        self.client = client
        self.workspace = workspace
        self.limits = limits
        self.destroyed = False
        self._destroy_lock = threading.Lock()
        self.keep_workspace = False
        self.scratch_dirs: list[str] = []

    @property
    def hello(self) -> dict[str, Any]:
        return self.client.hello

    def alive(self) -> bool:
        return not self.destroyed and not self.client.dead

    def kill(self) -> None:
        """Kill every process of the box. Subclasses override."""

    def oom_events(self) -> int:
        """How many OOM kills the box's memory limit has caused so far (0 where unknown)."""
        return 0

    def cleanup(self) -> None:
        """Remove what the box owns on the host: scratch dirs always, the workspace unless kept."""
        for d in self.scratch_dirs:
            shutil.rmtree(d, ignore_errors=True)
        if self.workspace and not self.keep_workspace:
            shutil.rmtree(self.workspace, ignore_errors=True)

    def destroy(self) -> None:
        with self._destroy_lock:
            if self.destroyed:
                return
            self.destroyed = True
        if not self.client.dead:
            try:
                self.client.call("shutdown", timeout=2.0)
            except Exception:  # noqa: BLE001 - a dying box may not answer
                pass
        try:
            self.kill()
        finally:
            self.client.close()
            self.cleanup()

    def info(self) -> dict[str, Any]:
        return {"box": self.name, "agent_pid": self.hello.get("pid"), "preloaded": self.hello.get("preloaded", [])}


class ProcessBox(Box):
    """A box whose agent is a direct child process talking over its stdin/stdout."""

    def __init__(self, name: str, proc: subprocess.Popen, workspace: str | None, limits: dict[str, Any]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        transport = PipeTransport(proc.stdin.fileno(), proc.stdout.fileno(), owns_fds=False)
        super().__init__(name, AgentClient(transport, name), workspace, limits)
        self.proc = proc

    def alive(self) -> bool:
        return super().alive() and self.proc.poll() is None

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        try:
            self.client.wait_ready(timeout)
        except Exception:
            self.destroyed = True
            self.kill()
            self.cleanup()
            raise

    def kill(self) -> None:
        from ..agent import procs

        pid = self.proc.pid
        try:
            victims = procs.descendants(pid)
        except OSError:
            victims = []
        for p in [pid, *victims]:
            try:
                os.kill(p, 9)
            except OSError:
                pass
        try:
            os.killpg(pid, 9)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.error("box %s: agent pid %s did not exit after SIGKILL", self.name, pid)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass
