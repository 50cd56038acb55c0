"""The admin console's "test connection": really run a tiny program on a provider built from a
config that is not (yet) the active one. Split from provider_manager.py: it builds a throw-away
provider and never touches the manager's state.
"""

from __future__ import annotations

import re
import time
from typing import Any

from ..errors import SandboxError, operator_message
from ..providers import registry
from ..providers.base import SandboxProvider
from ..redaction import scrub

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
    secrets = secret_values(name, config)
    return {"success": ok, "message": scrub(message, secrets), "latency_ms": latency_ms,
            "details": scrub(details, secrets)}


def secret_values(name: str, config: dict[str, Any]) -> list[Any]:
    """The values of ``config``'s secret fields (``secret: true`` in the provider's schema; nested
    ones such as network_credentials' header values are found by redaction.scrub). Non-secret
    fields (URLs, names) stay readable in the message. A provider with no schema here: every field
    whose name looks like a credential."""
    try:
        schema = registry.get_provider_class(name).get_config_schema()
        fields = [k for k, spec in schema.items() if spec.get("secret")]
    except Exception:  # noqa: BLE001 - an unknown provider: guess by the field names
        fields = [k for k in config if _CREDENTIAL_NAME.search(str(k))]
    return [config.get(k) for k in fields if config.get(k)]


_CREDENTIAL_NAME = re.compile(r"key|secret|token|pass|credential|auth", re.IGNORECASE)
