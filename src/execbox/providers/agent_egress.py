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
            link.set_policy(self.enforced_egress(inst))

    def enforced_egress(self, inst: Instance) -> EgressPolicy:
        """What the box's gateway enforces now: the session's policy, narrowed further while a run
        asked for less. The two are kept apart so that the end of a run puts back the session's
        policy as it is then (a session narrowed during the run stays narrowed)."""
        session = inst.egress or self.egress_cap
        return session if inst.egress_run is None else session.intersect(inst.egress_run)

    def effective_network(self, instance_id: str, inst: Instance | None = None) -> dict[str, Any]:
        return self.enforced_egress(inst or self._get(instance_id)).to_dict()

    def _narrowed(self, inst: Instance, network: Any, allow: Any, tenant_cap: EgressPolicy | None) -> EgressPolicy:
        """The requested policy, validated (SB002 naming a bad entry) and checked against the
        provider's policy, the tenant's cap and the session's policy (403 naming what is wider)."""
        requested = parse_policy(network, allow)
        effective = self.egress_cap.narrow(requested)
        if tenant_cap is not None:
            tenant_cap.narrow(requested)
        return (inst.egress or self.egress_cap).narrow(effective)

    def _apply_egress(self, inst: Instance, session: EgressPolicy | None, run: EgressPolicy | None,
                      narrowing: bool) -> None:
        """Set the instance's policies and hand the enforced one to the box (and the backend's store).
        A narrowing the backend cannot store is undone, so nothing is half-applied."""
        before = inst.egress, inst.egress_run
        inst.egress, inst.egress_run = session, run
        link = egress_link(inst.box)
        if link is not None:
            link.set_policy(self.enforced_egress(inst))
        try:
            self._publish_egress(inst, narrowing=narrowing)
        except Exception:
            if narrowing:
                inst.egress, inst.egress_run = before
                if link is not None:
                    link.set_policy(self.enforced_egress(inst))
            raise

    def set_network_policy(self, instance_id: str, network: Any, allow: Any = None,
                           tenant_cap: EgressPolicy | None = None) -> dict[str, Any]:
        """Narrow a live instance's network policy (never widen); takes effect for new connections.

        Checked against the provider's policy, the tenant's cap and the session's current policy;
        nothing changes on any error. Returns the session's new policy; a run's own narrowing in
        progress stays on top of it until that run ends."""
        inst = self._get(instance_id)
        with inst.egress_lock:
            effective = self._narrowed(inst, network, allow, tenant_cap)
            self._apply_egress(inst, effective, inst.egress_run, narrowing=True)
            return effective.to_dict()

    def _publish_egress(self, inst: Instance, narrowing: bool = False) -> None:
        """The instance's effective policy changed; backends whose policy lives outside the box's
        gateway link (kubernetes: on the pod, read by the egress proxy) store it here."""

    @contextmanager
    def network_for_run(self, instance_id: str, network: Any, allow: Any = None,
                        tenant_cap: EgressPolicy | None = None) -> Iterator[dict[str, Any]]:
        """Narrow the instance's policy for one run; afterwards the session's policy (as it is then)
        is enforced again."""
        inst = self._get(instance_id)
        with inst.egress_lock:
            run = self._narrowed(inst, network, allow, tenant_cap)
            self._apply_egress(inst, inst.egress, run, narrowing=True)
            effective = self.enforced_egress(inst).to_dict()
        try:
            yield effective
        finally:
            with inst.egress_lock:
                self._apply_egress(inst, inst.egress, None, narrowing=False)

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
