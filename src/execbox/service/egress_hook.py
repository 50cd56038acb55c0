"""Issue 14 hook for service/sessions.py: a session's network policy, narrowed by tenant caps.

sessions.py calls ``apply`` after it creates a session's instance (so a replacement box gets the
same policy) and ``describe`` in the session's dict; everything else about egress lives here and
in execbox.egress. ``caps_lookup`` is set by the service (tenant caps from the settings store).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..egress.policy import EgressPolicy, parse_policy

caps_lookup: Callable[[str], EgressPolicy | None] | None = None


def tenant_cap(tenant_id: str) -> EgressPolicy | None:
    return caps_lookup(tenant_id) if caps_lookup is not None else None


def apply(provider: Any, session: Any) -> None:
    """Give the session's box: (provider policy ∩ tenant cap), narrowed to the session's request."""
    if session.instance_id is not None:
        apply_to(provider, session.tenant_id, session.instance_id, getattr(session, "network", None))


def apply_to(provider: Any, tenant_id: str, instance_id: str, requested: dict[str, Any] | None = None) -> None:
    """Same for any instance (one-shot runs too: a tenant's cap must not be bypassed by them)."""
    if not hasattr(provider, "set_network_policy"):
        return
    cap = tenant_cap(tenant_id)
    if requested is None and cap is None:
        return
    ceiling = provider.egress_cap if cap is None else provider.egress_cap.intersect(cap)
    if requested is not None:
        # the session's own choice within what the provider and the tenant's cap allow *now*: a cap
        # (or provider policy) narrowed since the session chose must narrow it, never fail the box
        ceiling = ceiling.intersect(parse_policy(requested["network"], requested.get("allow")))
    provider.set_network_policy(instance_id, ceiling.mode, [e.text() for e in ceiling.allow], tenant_cap=cap)


def narrow_session(provider: Any, session: Any, network: Any, allow: Any) -> dict[str, Any]:
    """Validate and apply a narrower policy to a live session; 403 if wider than allowed."""
    parse_policy(network, allow)  # SB002 naming a bad entry before anything changes
    effective = provider.set_network_policy(session.instance_id, network, allow,
                                            tenant_cap=tenant_cap(session.tenant_id))
    session.network = {"network": effective["network"], "allow": effective["allow"]}
    return effective


def describe(session: Any) -> dict[str, Any]:
    prov = session.provider
    if prov is None or session.instance_id is None or not hasattr(prov, "effective_network"):
        return {"network": None}
    try:
        return {"network": prov.effective_network(session.instance_id)}
    except Exception:  # noqa: BLE001 - a gone instance has no policy to show
        return {"network": None}


def for_run(provider: Any, instance_id: str, tenant_id: str, spec: dict[str, Any] | None,
            fn: Callable[[], Any]) -> Any:
    """Run ``fn`` with the instance's policy narrowed by the request's ``network`` (this run only)."""
    if spec is None:
        return fn()
    if not isinstance(spec, dict) or set(spec) - {"network", "allow"}:
        from ..errors import InvalidConfigError

        raise InvalidConfigError("network must be an object {network, allow}", details={"field": "network"})
    parse_policy(spec.get("network"), spec.get("allow"))  # SB002 naming a bad entry
    if not hasattr(provider, "network_for_run"):
        if spec.get("network") in (None, "none"):
            return fn()  # remote providers: nothing to narrow to beyond none
        from ..egress.policy import EgressDenied

        raise EgressDenied(f"provider {provider.name!r} does not police egress; only network=none is possible",
                           details={"provider": provider.name})
    with provider.network_for_run(instance_id, spec.get("network"), spec.get("allow"), tenant_cap(tenant_id)):
        return fn()
