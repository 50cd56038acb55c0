"""Provider config fields of the egress policy (shared by every self-hosted provider)."""

from __future__ import annotations

from typing import Any

NETWORK_SCHEMA: dict[str, dict[str, Any]] = {
    "network": {
        "type": "string", "default": "none", "options": ["none", "allowlist", "open"], "label": "Network",
        "description": "Egress of each box: none (no network), allowlist (only network_allow), or open "
                       "(any public address). Loopback, host, link-local/metadata and private ranges stay "
                       "denied unless listed as an exact CIDR. Sessions may only narrow it.",
    },
    "network_allow": {
        "type": "list", "label": "Allowed destinations",
        "description": "HOST[:PORTS] entries (comma-separated): api.example.com, *.pypi.org:443, "
                       "203.0.113.0/24:80|443. Default ports 80 and 443.",
    },
}
