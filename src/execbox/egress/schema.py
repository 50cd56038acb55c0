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
    "network_credentials": {
        "type": "string", "secret": True, "label": "Injected credentials",
        "placeholder": "{\"api.example.com\": {\"Authorization\": \"Bearer ...\"}}",
        "description": "JSON {host: {header: value}}: headers the gateway adds to HTTPS requests to that exact, "
                       "allowed host. Stored encrypted; boxes never see them (they trust a per-box CA).",
    },
}


def policy_from_config(config: dict[str, Any]):  # type: ignore[no-untyped-def]
    """The provider's EgressPolicy from its config (SB002 naming a bad entry or credential host)."""
    from .policy import parse_policy, with_credentials

    return with_credentials(parse_policy(config.get("network"), config.get("network_allow")),
                            config.get("network_credentials"))


def check_network_config(config: dict[str, Any]) -> tuple[bool, str | None]:
    """validate_config's network part: ``(False, "field: why")`` naming the bad entry, or host gaps."""
    from ..boxes import netns
    from ..errors import InvalidConfigError

    try:
        policy = policy_from_config(config)
    except InvalidConfigError as e:
        return False, f"{e.details.get('field', 'network_allow')}: {e.message}"
    if policy.mode != "none":
        ok, why = netns.available()
        if not ok:
            return False, f"network: {why}"
    return True, None
