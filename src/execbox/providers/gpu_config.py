"""The GPU opt-in's provider config fields, shared by the jail and Docker providers."""

from __future__ import annotations

from typing import Any

from ..boxes import gpu
from ..errors import InvalidConfigError

GPU_SCHEMA: dict[str, dict[str, Any]] = {
    "gpu": {"type": "string", "default": "off", "label": "GPUs per box",
            "placeholder": "off",
            "description": "NVIDIA GPU passthrough, off by default: 'all' or device indices such as '0,1'. "
                           "A session asking where the host has no such GPU fails with SB002."},
    "gpu_tenant_cap": {"type": "string", "default": "", "label": "GPU cap per tenant",
                       "placeholder": "1 or acme=2,*=1",
                       "description": "Most GPUs one tenant's live sessions may hold together: N for every "
                                      "tenant, or TENANT=N pairs with '*' as the default. Empty: no cap. "
                                      "A session past the cap fails with SB008."},
}


def gpu_config_error(config: dict[str, Any]) -> tuple[bool, str | None]:
    """(ok, message) for ``validate_config``: the values' syntax (host facts are checked later)."""
    try:
        gpu.parse_gpu(config.get("gpu"))
        gpu.parse_tenant_cap(config.get("gpu_tenant_cap"))
    except InvalidConfigError as e:
        return False, e.message
    return True, None
