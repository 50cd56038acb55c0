"""The admin console's "test connection": really run a tiny program on a provider built from a
config that is not (yet) the active one. Split from provider_manager.py: it builds a throw-away
provider and never touches the manager's state.
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import SandboxError, operator_message
from ..providers import registry
from ..providers.base import SandboxProvider

PROBE_CODE = "import sys\nprint('execbox-probe', 6 * 7)\nprint('probe-stderr', file=sys.stderr)\n"
PROBE_BASH = "echo execbox-probe $((6 * 7)); echo probe-stderr >&2"


def probe(name: str, config: dict[str, Any], timeout: int = 30) -> dict[str, Any]:
    """Really run a tiny program on a provider built from ``config``: {success, message,
    latency_ms, details{exit_code, stdout, stderr}}. Never raises for provider failures."""
    started = time.perf_counter()
    details: dict[str, Any] = {"exit_code": None, "stdout": "", "stderr": ""}
    provider: SandboxProvider | None = None
    instance_id: str | None = None
    try:
        provider = registry.create_provider(name, config)
        languages = provider.get_supported_languages()
        lang, code = ("python", PROBE_CODE) if "python" in languages else ("bash", PROBE_BASH)
        instance_id = provider.create_instance(lang).instance_id
        result = provider.execute_code(instance_id, code, lang, timeout=timeout)
        details = {"exit_code": result.exit_code, "stdout": result.stdout[:4096], "stderr": result.stderr[:4096]}
        ok = result.exit_code == 0 and "execbox-probe 42" in result.stdout
        message = (f"{name}: probe ran in {lang}" if ok
                   else f"{name}: probe finished with exit code {result.exit_code} and unexpected output")
    except SandboxError as e:
        ok, message = False, operator_message(e)
        details["error_code"] = e.code
    except Exception as e:  # noqa: BLE001 - report, never crash the admin API
        ok, message = False, f"{type(e).__name__}: {e}"
    finally:
        if provider is not None:
            try:
                if instance_id is not None:
                    provider.destroy_instance(instance_id)
            finally:
                provider.shutdown()
    latency_ms = round((time.perf_counter() - started) * 1000, 1)
    return {"success": ok, "message": _scrub(message, config), "latency_ms": latency_ms,
            "details": {k: _scrub(v, config) if isinstance(v, str) else v for k, v in details.items()}}


def _scrub(text: str, config: dict[str, Any]) -> str:
    """Remove any configured value long enough to be a credential from a message."""
    for v in config.values():
        if isinstance(v, str) and len(v) >= 8 and v in text:
            text = text.replace(v, "****" + v[-4:])
    return text
