"""One request through the agent, for boxes we do not start ourselves (E2B, AgentRun).

A cloud sandbox runs commands or notebook cells, not our long-lived agent. So the host uploads
the agent (this package, as a zipapp) once per sandbox and, per request, runs::

    python3 execbox-agent-<hash>.pyz oneshot --workspace /home/user /tmp/request.json

This module forks the ordinary agent (``main.main``) with its protocol on two pipes, sends it the
request, and prints every event and then the reply as one JSON line each on stdout (ASCII only,
so any transport carries it unchanged). User code never writes to this stdout: the agent runs it
with its own pipes. Execution semantics therefore are the agent's, by construction.
Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import protocol

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any

REQUEST_ID = 1


def _emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def run(request: dict[str, Any], workspace: str, limits: dict[str, Any]) -> int:
    """Fork an agent, send ``request``, print its events and reply; 0 when a reply came."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the agent: protocol on fds 0/1, exactly as a box's main process
        code = 0
        try:
            os.dup2(req_r, 0)
            os.dup2(rep_w, 1)
            # Not our stderr: the command must end when this driver does, not when the agent
            # has finished its shutdown in the background.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            for fd in (req_r, req_w, rep_r, rep_w, devnull):
                os.close(fd)
            from . import main as agent_main

            agent_main.main(["--workspace", workspace, "--preload", "none", "--limits", json.dumps(limits)])
        except BaseException:  # noqa: BLE001 - the parent reports the missing reply
            code = 70
        os._exit(code)
    os.close(req_r)
    os.close(rep_w)
    frames = protocol.FrameBuffer()
    replied = False
    try:
        # The request pipe stays open until the reply: the agent reads EOF as "host gone, cancel".
        protocol.write_frame(req_w, {**request, "id": REQUEST_ID})
        while not replied:
            data = os.read(rep_r, 1 << 20)
            if not data:
                break
            for msg in frames.feed(data):
                if msg.get("event") == "ready":
                    continue
                _emit(msg)
                if "ok" in msg and msg.get("id") == REQUEST_ID:
                    replied = True
    except OSError:
        pass
    finally:
        # EOF on its input: the agent shuts down (ends leftover children) on its own. The run's
        # processes already ended with the run, so nobody waits for that.
        os.close(req_w)
        os.close(rep_r)
        if not replied:
            os.waitpid(pid, 0)
    if not replied:
        _emit({"id": REQUEST_ID, "ok": False, "error": {
            "code": "SB009", "status": 503, "message": "the agent ended without a reply", "details": {}}})
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="execbox-agent oneshot")
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--limits", default="{}", help="JSON rlimits applied to the run's child")
    parser.add_argument("request", help="a JSON file holding one agent request; removed once read")
    ns = parser.parse_args(argv)
    with open(ns.request, encoding="utf-8") as f:
        request = json.load(f)
    try:
        os.unlink(ns.request)
    except OSError:
        pass
    return run(request, ns.workspace, json.loads(ns.limits))


if __name__ == "__main__":
    sys.exit(main())
