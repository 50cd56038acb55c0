"""Provider ``aliyun_codeinterpreter``'s configuration: admin schema, its checks and the AGENTRUN_*
environment fallbacks. Split from providers/aliyun.py, which keeps the sandbox lifecycle and execution.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .schema import url_problem

HARD_TIMEOUT = 30  # seconds: the service's hard execution limit
DEFAULT_TEMPLATE = "execbox-code-interpreter"
REGIONS = ["cn-hangzhou", "cn-beijing", "cn-shanghai", "cn-shenzhen", "cn-guangzhou"]
ENV_FALLBACKS = {
    "access_key_id": "AGENTRUN_ACCESS_KEY_ID",
    "access_key_secret": "AGENTRUN_ACCESS_KEY_SECRET",
    "account_id": "AGENTRUN_ACCOUNT_ID",
    "region": "AGENTRUN_REGION",
    "control_endpoint": "AGENTRUN_CONTROL_ENDPOINT",
    "data_endpoint": "AGENTRUN_DATA_ENDPOINT",
}
WORKDIR = "/home/user"


def config_schema() -> dict[str, dict[str, Any]]:
    """The admin console's fields for provider ``aliyun_codeinterpreter`` (validated by providers/schema.py)."""
    return {
        "access_key_id": {"type": "string", "required": True, "secret": True, "label": "Access Key ID",
                          "description": "AccessKey ID of a RAM user (env AGENTRUN_ACCESS_KEY_ID)."},
        "access_key_secret": {"type": "string", "required": True, "secret": True,
                              "label": "Access Key Secret",
                              "description": "AccessKey Secret (env AGENTRUN_ACCESS_KEY_SECRET)."},
        "account_id": {"type": "string", "required": True, "label": "Account ID",
                       "description": "Aliyun primary account ID, required for API calls "
                                      "(env AGENTRUN_ACCOUNT_ID)."},
        "region": {"type": "string", "default": "cn-hangzhou", "label": "Region", "options": REGIONS,
                   "description": "Region of the Code Interpreter service (env AGENTRUN_REGION)."},
        "template_name": {"type": "string", "required": False, "label": "Template Name",
                          "description": "Existing sandbox template; empty: execbox gets or creates "
                                         f"{DEFAULT_TEMPLATE!r}."},
        "timeout": {"type": "integer", "default": 30, "min": 1, "max": HARD_TIMEOUT,
                    "label": "Execution Timeout (seconds)",
                    "description": "Code execution timeout (max 30 seconds - hard limit)."},
        # secret_destination: where the access keys are sent, so a changed one needs them re-entered
        "control_endpoint": {"type": "string", "label": "Control endpoint", "secret_destination": True,
                             "description": "Advanced: override the control-plane endpoint "
                                            "(env AGENTRUN_CONTROL_ENDPOINT)."},
        "data_endpoint": {"type": "string", "label": "Data endpoint", "secret_destination": True,
                          "description": "Advanced: override the data-plane endpoint, e.g. a VPC "
                                         "endpoint (env AGENTRUN_DATA_ENDPOINT)."},
    }


def with_env_fallbacks(config: Mapping[str, Any], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Fill keys missing from ``config`` from their AGENTRUN_* variables."""
    env = os.environ if env is None else env
    out = dict(config)
    for key, var in ENV_FALLBACKS.items():
        if out.get(key) in (None, "") and env.get(var, "").strip():
            out[key] = env[var].strip()
    return out


def config_error(config: dict[str, Any]) -> tuple[bool, str | None]:
    """Checks beyond the schema: (ok, message)."""
    for key in ("control_endpoint", "data_endpoint"):
        url = config.get(key)
        problem = url_problem(key, url, secret_field="access_key_secret") if url else None
        if problem:
            return False, problem
    if not str(config.get("account_id", "")).strip().isdigit():
        return False, "account_id must be the numeric primary account ID"
    return True, None
