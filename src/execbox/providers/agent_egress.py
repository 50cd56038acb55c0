"""Network egress policy of agent-backed instances: the provider's cap, narrowed per session or run.

The box's gateway attachment enforces it; this side only computes the effective policy and hands
it over, so narrowing a live session takes effect without restarting its box.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..boxes.box import Box
from ..egress.policy import EgressPolicy, parse_policy

if TYPE_CHECKING:
    from .agent_backed import Instance


class AgentEgressMixin:
    """Needs ``_get(instance_id)`` from AgentBackedProvider."""

    egress_cap: EgressPolicy = EgressPolicy()  # the provider's network policy; sessions only narrow it
    _get: Any

    def _bind_egress(self, inst: Instance) -> None:
        """A box handed to an instance: its audit records name the tenant/session; provider policy."""
        link = egress_link(inst.box)
        if link is not None:
            link.tenant_id, link.session_id = inst.tenant_id, inst.session_id
            link.set_policy(inst.egress or self.egress_cap)

    def effective_network(self, instance_id: str, inst: Instance | None = None) -> dict[str, Any]:
        inst = inst or self._get(instance_id)
        return (inst.egress or self.egress_cap).to_dict()

    def set_network_policy(self, instance_id: str, network: Any, allow: Any = None,
                           tenant_cap: EgressPolicy | None = None) -> dict[str, Any]:
        """Narrow a live instance's network policy (never widen); takes effect for new connections.

        The request is validated (SB002 naming a bad entry), then checked against the provider's
        policy and the tenant's cap (403 naming what is wider); nothing changes on any error.
        """
        inst = self._get(instance_id)
        requested = parse_policy(network, allow)
        effective = self.egress_cap.narrow(requested)
        if tenant_cap is not None:
            tenant_cap.narrow(requested)
        current = inst.egress or self.egress_cap
        effective = current.narrow(effective)
        link = egress_link(inst.box)
        if link is not None:
            link.set_policy(effective)
        before, inst.egress = inst.egress, effective
        try:
            self._publish_egress(inst, narrowing=True)
        except Exception:
            inst.egress = before  # nothing half-applied
            if link is not None:
                link.set_policy(before or self.egress_cap)
            raise
        return effective.to_dict()

    def _publish_egress(self, inst: Instance, narrowing: bool = False) -> None:
        """The instance's effective policy changed; backends whose policy lives outside the box's
        gateway link (kubernetes: on the pod, read by the egress proxy) store it here."""

    @contextmanager
    def network_for_run(self, instance_id: str, network: Any, allow: Any = None,
                        tenant_cap: EgressPolicy | None = None) -> Iterator[dict[str, Any]]:
        """Narrow the instance's policy for one run, then put the previous one back."""
        inst = self._get(instance_id)
        before = inst.egress
        effective = self.set_network_policy(instance_id, network, allow, tenant_cap)
        try:
            yield effective
        finally:
            inst.egress = before
            link = egress_link(inst.box)
            if link is not None:
                link.set_policy(before or self.egress_cap)
            self._publish_egress(inst)

    def install_packages(self, instance_id: str, pip: list[str] | None = None, npm: list[str] | None = None,
                         timeout: float | None = None) -> dict[str, Any]:
        """pip/npm packages into the instance's workspace through the gateway (providers/install.py):
        the index hosts are the box's only destinations for the step, then its policy is restored."""
        from .install import run_install

        return run_install(self, instance_id, pip, npm, timeout)


def egress_link(box: Box) -> Any:
    """The box's gateway attachment (egress/gateway.BoxLink) when it has network, else None."""
    net = getattr(box, "net", None)
    return getattr(net, "link", None)
