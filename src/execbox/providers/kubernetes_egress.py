"""Egress for kubernetes boxes: the pod's policy lives on the pod, the gateway's proxy enforces it.

Pods cannot be given the jail/docker path (iptables REDIRECT into a per-box gateway socket: all
capabilities are dropped and the gateway runs on other nodes), so every pod's environment names
the gateway's explicit forward proxy (egress/proxy.py) with per-pod credentials, and the sandbox
NetworkPolicy lets only pods labelled ``execbox.dev/egress=on`` reach it (nothing else at all).

The effective policy of a claimed pod is the annotation ``execbox.dev/egress-policy``, written at
claim and whenever a session or run narrows it; the proxy of *any* gateway replica reads it (GET
the pod, cached ``EGRESS_TTL`` s), so a narrowing reaches other replicas within that TTL and the
replica that made it at once. The grant names the pod's IPs (``status.podIPs``): the proxy takes a
pod's credentials only from the pod's own address, as they are in its env, readable by any code
in it. ``network_credentials`` (header injection) is not offered here.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from typing import Any

from ..boxes import k8s_spec as ks
from ..boxes.k8s_box import marked_ended, pod_addresses
from ..egress.policy import EgressPolicy, parse_policy
from ..egress.proxy import EgressProxy, Grant, share, unshare
from ..egress.schema import NETWORK_SCHEMA
from ..errors import InvalidConfigError, ProviderUnavailableError, SandboxError
from .agent_backed import AgentBackedProvider, Instance

log = logging.getLogger("execbox.provider.kubernetes")

EGRESS_TTL = 2.0  # seconds a proxy trusts its copy of a pod's policy


def egress_schema() -> dict[str, dict[str, Any]]:
    return {
        "network": NETWORK_SCHEMA["network"],
        "network_allow": NETWORK_SCHEMA["network_allow"],
        "egress_proxy": {"type": "string", "default": "", "label": "Egress proxy (pods)",
                         "description": "host:port box pods use to reach the gateway's egress proxy, e.g. the "
                                        "Service execbox-egress.execbox.svc:15080. Needed when network is not "
                                        "none."},
        "egress_proxy_listen": {"type": "string", "default": "0.0.0.0:15080", "label": "Egress proxy listen",
                                "description": "Address this gateway serves the egress proxy on when network "
                                               "is not none; empty = serve none (another replica does)."},
    }


def _host_port(text: str, *, allow_zero: bool) -> tuple[str, int] | None:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or any(c in host for c in "/@ \t[]"):
        return None
    n = int(port)
    return (host, n) if (allow_zero or n >= 1) and n <= 65535 else None


def _resolved(proxy: str) -> str:
    """``egress_proxy`` with its host resolved here: box pods have no DNS (the sandbox NetworkPolicy
    denies it), so their env names the address (the Service's ClusterIP), not the name."""
    hp = _host_port(proxy, allow_zero=False)
    assert hp is not None  # egress_problem checked it
    try:
        infos = socket.getaddrinfo(hp[0], hp[1], socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise ProviderUnavailableError(f"kubernetes: egress_proxy host {hp[0]!r} does not resolve on the gateway "
                                       f"({e}); pods need its address", details={"provider": "kubernetes",
                                                                                 "field": "egress_proxy"}) from None
    return f"{infos[0][4][0]}:{hp[1]}"


def egress_problem(c: dict[str, Any]) -> str | None:
    """What is wrong with the egress part of a checked config, or None."""
    try:
        policy = parse_policy(c.get("network"), c.get("network_allow"))
    except InvalidConfigError as e:
        return f"{e.details.get('field', 'network_allow')}: {e.message}"
    if c.get("egress_proxy") and _host_port(c["egress_proxy"], allow_zero=False) is None:
        return "egress_proxy: must be host:port (e.g. execbox-egress.execbox.svc:15080)"
    if c.get("egress_proxy_listen") and _host_port(c["egress_proxy_listen"], allow_zero=True) is None:
        return "egress_proxy_listen: must be address:port (e.g. 0.0.0.0:15080), or empty"
    if policy.mode != "none" and not c.get("egress_proxy"):
        return (f"egress_proxy: network {policy.mode!r} needs the address pods reach the gateway's egress "
                "proxy at (e.g. execbox-egress.execbox.svc:15080)")
    return None


class KubernetesEgressMixin(AgentBackedProvider):
    api: Any
    _secret: bytes
    templates: dict[str, ks.PodTemplate]
    _undeleted: dict[str, bool]  # kubernetes_sweep.py: pods of gone sessions whose delete failed

    def __init__(self) -> None:
        super().__init__()
        self.proxy: EgressProxy | None = None
        self.egress_proxy_address = ""  # egress_proxy with its host resolved: what pods' env names
        self._egress_cache: dict[str, tuple[float, Grant | None]] = {}
        self._egress_locks = [threading.Lock() for _ in range(32)]  # striped by pod: claims stay parallel

    def initialize(self, config: dict[str, Any]) -> bool:
        if (config or {}).get("network_credentials") not in (None, "", {}):
            raise InvalidConfigError(
                "invalid kubernetes configuration: network_credentials (credential injection) is not available on "
                "kubernetes: pods reach the network through the gateway's forward proxy, which does not "
                "inject headers; use the jail or docker provider for it",
                details={"provider": "kubernetes", "field": "network_credentials"})
        return super().initialize(config)

    def _prepare_egress(self) -> None:
        """Provider policy, the proxy address pods get, and the proxy this replica serves."""
        c = self.config
        self.egress_cap = parse_policy(c.get("network"), c.get("network_allow"))
        self._egress_cache = {}
        self.egress_proxy_address = ""
        if self.egress_cap.mode != "none":
            self.egress_proxy_address = _resolved(c["egress_proxy"])
        listen = _host_port(c.get("egress_proxy_listen") or "", allow_zero=True)
        if self.egress_cap.mode == "none" or listen is None:
            return
        try:  # one proxy per address and process: a provider rebuilt on a config change shares it
            self.proxy = share(listen, self)
        except OSError as e:
            raise ProviderUnavailableError(f"kubernetes: cannot serve the egress proxy on "
                                           f"{c['egress_proxy_listen']} (egress_proxy_listen): {e.strerror or e}",
                                           details={"provider": "kubernetes", "field": "egress_proxy_listen"}) from None

    def install_packages(self, instance_id: str, pip: list[str] | None = None, npm: list[str] | None = None,
                         timeout: float | None = None) -> dict[str, Any]:
        """Not here: the install step's temporary index-hosts policy needs the jail/docker gateway link."""
        raise InvalidConfigError("in-session package install is not available on kubernetes; allow the index "
                                 "hosts in the network policy and run pip/npm in the pod (they use the egress "
                                 "proxy), or build the packages into the worker image",
                                 details={"provider": "kubernetes", "field": "install"})

    def egress_token(self, pod_name: str) -> str:
        return ks.egress_token(self._secret, pod_name)

    def shutdown(self) -> None:
        super().shutdown()
        if self.proxy is not None:
            unshare(self.proxy, self)
            self.proxy = None

    def applied_limits(self) -> dict[str, Any]:
        return {**super().applied_limits(), "network": self.egress_cap.mode,
                "egress_proxy": self.egress_proxy_address or None}

    # -- the policy on the pod ----------------------------------------------------------------
    def egress_metadata(self, policy: EgressPolicy) -> dict[str, Any]:
        """The pod patch that carries ``policy`` (label for the NetworkPolicy, annotation for the proxy)."""
        return {"labels": {ks.L_EGRESS: "off" if policy.mode == "none" else "on"},
                "annotations": {ks.A_EGRESS: json.dumps(policy.to_dict(), sort_keys=True)}}

    def _publish_egress(self, inst: Instance, narrowing: bool = False) -> None:
        """Store the instance's current policy on its pod (and in this replica's proxy cache at once).

        A failed patch never leaves more access than asked for: a narrowing raises (SB009; the caller
        puts the previous policy back, as the pod still has it), a widening back (the end of a run's
        narrowing) only logs, the pod keeping the narrower policy."""
        try:
            self.patch_with_egress(inst, {})
        except SandboxError as e:
            if narrowing:
                raise ProviderUnavailableError(f"kubernetes: could not store the narrowed network policy on the "
                                               f"pod of {inst.instance_id}: {e.message}",
                                               details={"provider": "kubernetes", "instance_id": inst.instance_id}
                                               ) from None
            log.warning("kubernetes: storing the egress policy on the pod of %s failed: %s", inst.instance_id,
                        e.message)

    def patch_with_egress(self, inst: Instance, patch: dict[str, Any]) -> None:
        """Patch the instance's pod with ``patch`` plus its current egress policy.

        Under the pod's lock the policy is read when the patch is sent, so a background claim and a
        narrowing cannot land in the wrong order and leave the wider policy on the pod."""
        name = getattr(inst.box, "name", None)
        if name is None or self.api is None:
            return
        with self._egress_locks[hash(name) % len(self._egress_locks)]:
            policy = self.enforced_egress(inst)
            addresses = tuple(getattr(inst.box, "addresses", None) or ())
            if addresses:
                self._egress_cache[name] = (time.monotonic(), Grant(policy, inst.tenant_id, inst.session_id,
                                                                   inst.instance_id, addresses))
            else:  # never a grant that does not name the pod's addresses: the proxy reads the pod
                self._egress_cache.pop(name, None)
            meta = self.egress_metadata(policy)
            body = {**patch, "metadata": {
                "labels": {**(patch.get("metadata") or {}).get("labels", {}), **meta["labels"]},
                "annotations": {**(patch.get("metadata") or {}).get("annotations", {}), **meta["annotations"]}}}
            try:
                self.api.patch_pod(name, body)
            except SandboxError:
                self._egress_cache.pop(name, None)  # the proxy reads the pod again: what it really has
                raise

    def policy_of(self, pod: Any) -> EgressPolicy | None:
        """The policy stored on a pod, or None when there is none (a warm pod)."""
        raw = (pod.metadata.annotations or {}).get(ks.A_EGRESS)
        if not raw:
            return None
        try:
            d = json.loads(raw)
            return self.egress_cap.narrow(parse_policy(d.get("network"), d.get("allow")))
        except (ValueError, AttributeError, SandboxError):
            return EgressPolicy()  # unreadable or wider than the provider allows: no network

    def egress_lookup(self, pod_name: str) -> Grant | None:
        """The egress proxy's question (from a worker thread): may this pod go out, under what policy?"""
        if pod_name in getattr(self, "_undeleted", ()):
            return None  # its session is gone; only the pod's delete failed (kubernetes_sweep.py)
        now = time.monotonic()
        hit = self._egress_cache.get(pod_name)
        if hit is not None and now - hit[0] < EGRESS_TTL:
            return hit[1]
        try:
            pod = self.api.get_pod(pod_name) if self.api is not None else None
        except SandboxError as e:
            log.warning("kubernetes: egress lookup of pod %s failed: %s", pod_name, e.message)
            return None
        grant = self._grant_of(pod)
        if len(self._egress_cache) > 4096:
            self._egress_cache = {k: v for k, v in self._egress_cache.items() if now - v[0] < EGRESS_TTL}
        self._egress_cache[pod_name] = (now, grant)
        return grant

    def _grant_of(self, pod: Any) -> Grant | None:
        if pod is None or pod.metadata.namespace != self.config["namespace"]:
            return None
        labels = pod.metadata.labels or {}
        if any(labels.get(k) != v for k, v in ks.MANAGED.items()) or \
                labels.get(ks.L_TEMPLATE) not in {t.name for t in self.templates.values()}:
            return None  # not a box pod of this provider's templates
        if pod.metadata.deletion_timestamp is not None or (pod.status and pod.status.phase in ("Succeeded", "Failed")):
            return None
        if marked_ended(pod):
            return None  # a gone session's pod that is still to be deleted
        addresses = pod_addresses(pod)
        if not addresses:
            return None  # no IP yet: nothing it sends can come from it
        ann = pod.metadata.annotations or {}
        policy = self.policy_of(pod) if labels.get(ks.L_STATE) == ks.CLAIMED else None
        if labels.get(ks.L_EGRESS) != "on":
            policy = EgressPolicy()
        # The pod's own IPs: its token (readable by its code) is refused from any other client address.
        return Grant(policy or EgressPolicy(), ann.get(ks.A_TENANT) or None, ann.get(ks.A_SESSION) or None,
                     ann.get(ks.A_INSTANCE) or None, addresses)
