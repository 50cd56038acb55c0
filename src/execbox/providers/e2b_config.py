"""Provider ``e2b``'s configuration: admin schema, its checks and the lazily imported SDK.
Split from providers/e2b.py, which keeps the sandbox lifecycle and execution.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import ProviderUnavailableError
from .schema import parse_size, url_problem

DEFAULT_TEMPLATE = "code-interpreter-v1"
MIN_SANDBOX_TTL = 300  # seconds an E2B sandbox lives without activity (its own timeout)
DOMAIN = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*(:\d{1,5})?")
REGION_DOMAINS = {"us": None}  # None: the SDK's default domain; other regions need `domain`


def sdk() -> Any:
    try:
        import e2b_code_interpreter
    except ImportError as e:  # pragma: no cover - the dependency is declared
        raise ProviderUnavailableError("the e2b provider needs the e2b-code-interpreter package "
                                       "(pip install e2b-code-interpreter)", details={"missing": "e2b"}) from e
    return e2b_code_interpreter


def config_schema() -> dict[str, dict[str, Any]]:
    """The admin console's fields for provider ``e2b`` (validated by providers/schema.py)."""
    return {
        "api_key": {"type": "string", "required": True, "secret": True, "label": "API Key",
                    "description": "E2B API key (e2b_...)."},
        "region": {"type": "string", "default": "us", "label": "Region", "options": ["us", "eu"],
                   "description": "us uses E2B's default domain; other regions need `domain`."},
        # secret_destination: these decide where api_key is sent, so a changed one needs the key re-entered
        "domain": {"type": "string", "label": "Domain", "placeholder": "e2b.app", "secret_destination": True,
                   "description": "E2B domain (E2B_DOMAIN); set for self-hosted or E2B-compatible clouds."},
        "api_url": {"type": "string", "label": "API URL", "secret_destination": True,
                    "description": "Advanced: control-plane URL when it is not https://api.<domain>."},
        "sandbox_url": {"type": "string", "label": "Sandbox URL", "secret_destination": True,
                        "description": "Advanced: one URL for every sandbox port (proxies, tests)."},
        "template": {"type": "string", "default": DEFAULT_TEMPLATE, "label": "Template",
                     "description": "Sandbox template (needs the code interpreter for python/javascript)."},
        "timeout": {"type": "integer", "default": 30, "min": 1, "max": 3600,
                    "label": "Execution Timeout (seconds)", "description": "Default execution timeout."},
        "allow_internet_access": {"type": "boolean", "default": False, "label": "Internet access",
                                  "description": "Let sandboxes reach the internet (off by default)."},
        "workdir": {"type": "string", "default": "/home/user", "label": "Working directory",
                    "description": "The sandbox user's home: relative file paths resolve here."},
        "max_memory": {"type": "string", "format": "size", "label": "Memory per run", "placeholder": "512m",
                       "description": "Cap on each run inside the sandbox (address space for Python, heap for "
                                      "Node): a run past it is SB006 and the sandbox lives on. Empty: only the "
                                      "sandbox's own memory, whose OOM kill is a bare exit -9."},
    }


def config_error(config: dict[str, Any]) -> tuple[bool, str | None]:
    """Checks beyond the schema: (ok, message)."""
    if not config.get("domain") and config.get("region") not in REGION_DOMAINS:
        return False, (f"region {config.get('region')!r} has no built-in E2B domain; set `domain` "
                       "to that region's E2B domain")
    domain = str(config.get("domain") or "")
    if domain and (not DOMAIN.fullmatch(domain)):
        # never echoed: it could be user:password@host pasted in the wrong field
        return False, "domain must be a host name like e2b.app (no scheme, user:password@ or path)"
    for key in ("api_url", "sandbox_url"):
        url = config.get(key)
        problem = url_problem(key, url, secret_field="api_key") if url else None
        if problem:
            return False, problem
    if not str(config.get("workdir", "")).startswith("/"):
        return False, "workdir must be an absolute path"
    if config.get("max_memory"):
        try:
            if parse_size(config["max_memory"]) < 32 * 1024 * 1024:
                return False, "max_memory: must be at least 32m (the interpreter itself needs ~15 MB)"
        except ValueError as e:
            return False, f"max_memory: {e}"
    return True, None
