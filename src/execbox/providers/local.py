"""Provider ``local``: the agent as a plain subprocess. Isolation tier ``none``: development only.

Same agent, same semantics as every other self-hosted backend, with a temp workspace, rlimits
and an environment built from scratch, but no namespaces: the code can see the host.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from ..boxes.box import AGENT_BOOT, READY_TIMEOUT, ProcessBox
from ..models import Isolation
from .agent_backed import POLICY_SCHEMA, TIMEOUT_SCHEMA, AgentBackedProvider
from .schema import parse_size

WARNING = ("local provider: no isolation (tier 'none'); code runs as the service user and can read "
           "the host. Use it for development only.")


def clean_env(home: str, tmp: str, extra_path: list[str] | None = None) -> dict[str, str]:
    """The only environment a box gets: nothing from the host process leaks in."""
    path = ["/usr/local/bin", "/usr/bin", "/bin"]
    for p in extra_path or []:
        if p and p not in path:
            path.append(p)
    return {
        "PATH": ":".join(path),
        "HOME": home,
        "TMPDIR": tmp,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": tmp,
        "PYTHONDONTWRITEBYTECODE": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }


class LocalProvider(AgentBackedProvider):
    name = "local"
    display_name = "Local subprocess"
    description = "Runs code as a plain subprocess of the service. No isolation: development only."
    tags = ["development", "no-isolation"]
    isolation = Isolation.NONE
    zero_config = False  # never picked for a caller who asked for nothing: SANDBOX_TYPE=local, explicitly

    def effective_network(self, instance_id: str, inst: Any = None) -> dict[str, Any]:
        """The truth: code runs on the host's own network; no policy is enforced here."""
        return {"network": "open", "allow": [], "enforced": False}

    @staticmethod
    def get_config_schema() -> dict[str, dict[str, Any]]:
        return {
            **TIMEOUT_SCHEMA,
            "max_memory": {"type": "string", "default": "1g", "format": "size", "label": "Memory limit",
                           "description": "Data-segment rlimit per execution (e.g. 512m, 1g)."},
            "max_output_bytes": {"type": "integer", "default": 1048576, "min": 1024, "max": 64 * 1048576,
                                 "label": "Output cap (bytes)", "description": "Cap on stdout and stderr each."},
            "pool_size": {"type": "integer", "default": 0, "min": 0, "max": 32, "label": "Warm pool size",
                          "description": "Agents started ahead of time so one-shot runs skip start-up."},
            "python": {"type": "string", "default": "", "label": "Python interpreter",
                       "placeholder": sys.executable,
                       "description": "Interpreter that runs the agent and Python code (default: execbox's)."},
            "preload": {"type": "string", "default": "none", "label": "Preload modules",
                        "description": "'auto' (numpy, pandas, matplotlib if installed), 'none', or a "
                                       "comma-separated list ('auto,torch')."},
            **POLICY_SCHEMA,
        }

    def validate_config(self, config: dict[str, Any]) -> tuple[bool, str | None]:
        py = config.get("python") or sys.executable
        if not (os.path.isfile(py) and os.access(py, os.X_OK)):
            return False, f"python interpreter {py!r} is not an executable file"
        try:
            parse_size(config.get("max_memory") or "1g")
        except ValueError as e:
            return False, f"max_memory: {e}"
        return True, None

    def warnings(self) -> list[str]:
        return [WARNING]

    def applied_limits(self) -> dict[str, Any]:
        return {**super().applied_limits(), "max_memory": self.config.get("max_memory"),
                "enforced_by": "rlimit"}

    def start_box(self, workspace: str | None = None) -> ProcessBox:
        base = tempfile.mkdtemp(prefix="execbox-local-")
        tmp = os.path.join(base, "tmp")
        os.makedirs(tmp)
        ws = workspace or os.path.join(base, "workspace")
        os.makedirs(ws, exist_ok=True)
        python = self.config.get("python") or sys.executable
        src_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        limits = {"memory_bytes": parse_size(self.config.get("max_memory") or "1g"),
                  "fsize_bytes": 1024**3, "nofile": 1024}
        node = shutil.which("node")
        env = clean_env(ws, tmp, [os.path.dirname(node)] if node else None)
        argv = [python, "-I", "-c", AGENT_BOOT, src_root, "execbox.agent.main",
                "--workspace", ws, "--preload", self.config.get("preload") or "none",
                "--limits", json.dumps(limits)]
        proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, cwd=ws, start_new_session=True, close_fds=True,
        )
        box = ProcessBox(f"local-{proc.pid}", proc, ws, limits)
        box.scratch_dirs.append(base)
        if workspace is not None:
            box.keep_workspace = True
        box.wait_ready(READY_TIMEOUT)
        return box
