"""An MCP run that names no timeout gets the active provider's stored ``timeout``, as an HTTP run
does (``SANDBOX_TIMEOUT_SEC`` only seeds that at first boot); before, MCP used the env value and
the same service ran HTTP runs at 30 s and MCP runs at 7 s (review 34)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from execbox.mcp.core import Caller, ServiceCore
from execbox.service.executions import RunSpec


class _Provider:
    def __init__(self, stored: float | None) -> None:
        self.config: dict[str, Any] = {} if stored is None else {"timeout": stored}
        self.seen: list[float] = []

    def execute_code(self, instance_id: str, code: str, language: str, timeout: float, *_a: Any, **_k: Any) -> str:
        self.seen.append(timeout)
        return "ran"

    def run_command(self, instance_id: str, command: str, timeout: float, **_k: Any) -> str:
        self.seen.append(timeout)
        return "ran"


def _core(provider: _Provider, env_default: float = 7, max_timeout: float = 300) -> ServiceCore:
    def run(spec: RunSpec, handle: Any = None) -> Any:
        return spec.call(provider, "box-1", False, None)  # type: ignore[arg-type]

    return ServiceCore(SimpleNamespace(), SimpleNamespace(run=run), default_timeout=env_default,  # type: ignore[arg-type]
                       max_timeout=max_timeout)


@pytest.mark.parametrize(("stored", "asked", "expected"), [
    (30, None, 30),     # the provider's stored timeout, not the env's 7
    (None, None, 7),    # a provider without one: the service default
    (30, 12, 12),       # the caller's own
    (900, None, 300),   # within EXECBOX_MCP_MAX_TIMEOUT
])
def test_runs_and_commands_take_the_providers_stored_timeout(stored, asked, expected):
    provider = _Provider(stored)
    core = _core(provider)
    timeout, _ = core.timeout(asked)
    core.run_code(Caller("t"), None, "print(1)", "python", timeout, None, None)
    core.run_command(Caller("t"), None, "true", timeout, None)
    assert provider.seen == [expected, expected]
