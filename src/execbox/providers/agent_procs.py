"""Background processes in agent-backed boxes: start, poll, stdin, signal, list; pooled session boxes.

A mixin for :class:`~execbox.providers.agent_backed.AgentBackedProvider`. Each method is one
short agent request (``proc.*``, see ``execbox.agent.background``); the agent answers them even
while an ``exec`` runs in the same box, and the host's agent client sends them beside it, so a
long-running process never holds the box. Callers (the E2B envd process service) poll for output.
"""

from __future__ import annotations

import base64
from typing import Any

PROC_OP_TIMEOUT = 30.0


class BackgroundProcesses:
    """Needs ``_get`` and ``_call`` from AgentBackedProvider."""

    supports_background_processes = True

    def can_adopt_workspace(self, workspace: str) -> bool:
        """Whether a warm pooled box may become the box of a session with this (new) workspace."""
        return False

    def adopt_pooled(self, pool: Any, workspace: str) -> Any:
        """A warm box from ``pool`` made the box of a new session's ``workspace``, or None (cold start).

        Sessions bind their own workspace, so pooled boxes (started without one) were only for
        one-shot runs; a backend whose boxes can adopt a workspace (the jail: its fresh quota
        image becomes the session's) turns session start into a pool hit.
        """
        if not self.can_adopt_workspace(workspace):
            return None
        box = pool.take(0.0)
        if box is None:
            return None
        adopt = getattr(box, "adopt_workspace", None)
        try:
            if adopt is not None and adopt(workspace):
                return box
        except OSError:
            pass
        box.destroy()
        return None

    def _proc(self, instance_id: str, op: str, params: dict[str, Any]) -> Any:
        inst = self._get(instance_id)  # type: ignore[attr-defined]
        return self._call(inst, op, params, timeout=PROC_OP_TIMEOUT)  # type: ignore[attr-defined]

    def start_process(self, instance_id: str, command: str, *, cwd: str | None = None,
                      env: dict[str, str] | None = None, stdin: bool = False,
                      pty: tuple[int, int] | None = None, meta: dict[str, Any] | None = None) -> int:
        """Start ``bash -c command`` in the box; returns its pid there at once.

        ``pty=(cols, rows)`` runs it on a pseudo-terminal: its output is one stream (stdout) and
        stdin is the terminal's input. ``meta`` (a JSON object, at most 32 KiB) is kept by the agent
        and listed with the process, for a later service to adopt it (service/background.py).
        """
        params: dict[str, Any] = {"command": command, "cwd": cwd, "env": env or {}, "stdin": bool(stdin)}
        if pty is not None:
            params["pty"] = {"cols": int(pty[0]), "rows": int(pty[1])}
        if meta is not None:
            params["meta"] = meta
        return int(self._proc(instance_id, "proc.start", params)["pid"])

    def resize_process(self, instance_id: str, pid: int, cols: int, rows: int) -> None:
        self._proc(instance_id, "proc.resize", {"pid": pid, "cols": cols, "rows": rows})

    def poll_process(self, instance_id: str, pid: int, stdout_offset: int, stderr_offset: int) -> dict[str, Any]:
        """New output (bytes) past the offsets; ``exited`` with ``exit_code``/``signal`` once all is read."""
        v = self._proc(instance_id, "proc.poll",
                       {"pid": pid, "stdout_offset": stdout_offset, "stderr_offset": stderr_offset})
        out, err = v.pop("stdout_b64", ""), v.pop("stderr_b64", "")
        return {**v, "stdout": base64.b64decode(out), "stderr": base64.b64decode(err)}

    def process_input(self, instance_id: str, pid: int, data: bytes) -> None:
        self._proc(instance_id, "proc.input", {"pid": pid, "data_b64": base64.b64encode(data).decode()})

    def close_process_input(self, instance_id: str, pid: int) -> None:
        self._proc(instance_id, "proc.close_stdin", {"pid": pid})

    def signal_process(self, instance_id: str, pid: int, signal: str = "SIGKILL") -> bool:
        return bool(self._proc(instance_id, "proc.signal", {"pid": pid, "signal": signal}).get("signalled"))

    def list_processes(self, instance_id: str) -> list[dict[str, Any]]:
        return list(self._proc(instance_id, "proc.list", {}).get("processes") or [])

    def reset_context(self, instance_id: str, context_id: str) -> bool:
        """End a Python or JavaScript context (its globals are gone); False if it did not exist."""
        inst = self._get(instance_id)  # type: ignore[attr-defined]
        value = self._call(inst, "context.reset", {"context_id": context_id}, timeout=PROC_OP_TIMEOUT)  # type: ignore[attr-defined]
        return bool(value.get("reset"))
