"""The few Kubernetes API calls the provider makes, each with a request timeout and SB error mapping.

Errors are told twice: the SB009 message (what tenants read, through the service's error
replies) names the operation and the HTTP status only, never the API server's address, URLs,
the namespace, the ServiceAccount or a kubeconfig path; the whole error goes to the server log
(``execbox.kubernetes``), which is where an operator looks. No message or log line carries a
token.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from ..errors import SEE_LOG, ProviderUnavailableError, SandboxError

log = logging.getLogger("execbox.kubernetes")

RBAC_FILE = "deploy/kubernetes/base/rbac.yaml"


def _status_message(e: Any) -> str:
    """The ``message`` of the Status object an API error carries (it names objects, no secrets)."""
    try:
        body = json.loads(getattr(e, "body", None) or "{}")
    except (TypeError, ValueError):
        return ""
    return str(body.get("message") or "")[:300] if isinstance(body, dict) else ""


def api_error(what: str, namespace: str, e: Any) -> SandboxError:
    """An API server's error answer as SB009: the whole of it logged, the operation and status told."""
    reason = (getattr(e, "reason", "") or "").strip()
    status_msg = _status_message(e)
    details = {"provider": "kubernetes", "operation": what, "status": e.status}
    if e.status in (401, 403):
        log.warning("kubernetes API refused to %s in namespace %s (HTTP %s %s): %s; check the gateway's "
                    "ServiceAccount and Role (%s)", what, namespace, e.status, reason, status_msg, RBAC_FILE)
        return ProviderUnavailableError(f"kubernetes API refused to {what} (HTTP {e.status} {reason}): the "
                                        f"gateway's RBAC does not allow it; {SEE_LOG}", details=details)
    log.warning("kubernetes API error on %s in namespace %s: HTTP %s %s: %s", what, namespace, e.status, reason,
                status_msg)
    note = ""
    if e.status == 404 and status_msg.startswith("namespaces "):
        note = ": the sandbox namespace does not exist"
    elif status_msg and 400 <= e.status < 500:
        note = f": {status_msg.replace(namespace, '<namespace>') if namespace else status_msg}"
    return ProviderUnavailableError(f"kubernetes API error on {what}: HTTP {e.status} {reason}{note}",
                                    details=details)


def unreachable(what: str, namespace: str, e: BaseException) -> SandboxError:
    """A request that got no answer (timeout, refused, DNS, TLS) as SB009; the cause goes to the log."""
    log.warning("kubernetes API unreachable or too slow (%s in namespace %s): %s: %s", what, namespace,
                type(e).__name__, e)
    return ProviderUnavailableError(f"kubernetes API unreachable or too slow ({what}); {SEE_LOG}",
                                    details={"provider": "kubernetes", "operation": what})


def core_api(kubeconfig: str, context: str) -> Any:
    """A CoreV1Api from the kubeconfig (or the in-cluster service account when none is named)."""
    try:
        from kubernetes import client as k8s
        from kubernetes import config as kconfig
    except ImportError:
        raise ProviderUnavailableError("the kubernetes provider needs the `kubernetes` package "
                                       "(pip install 'execbox[kubernetes]')",
                                       details={"provider": "kubernetes"}) from None
    try:
        if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
            conf = k8s.Configuration()
            kconfig.load_incluster_config(client_configuration=conf)
            api_client = k8s.ApiClient(conf)
        else:
            api_client = kconfig.new_client_from_config(config_file=kubeconfig or None, context=context or None)
    except Exception as e:  # noqa: BLE001 - missing file, bad context, no service account
        log.warning("kubernetes: cannot load the cluster configuration (kubeconfig %r, context %r): %s: %s",
                    kubeconfig or "default", context or "current", type(e).__name__, e)
        raise ProviderUnavailableError("kubernetes: cannot load the cluster configuration (kubeconfig, context or "
                                       f"in-cluster service account); {SEE_LOG}",
                                       details={"provider": "kubernetes"}) from None
    return k8s.CoreV1Api(api_client)


class PodApi:
    """The few CoreV1 (and NetworkingV1) calls the provider makes, each with a request timeout."""

    def __init__(self, core: Any, namespace: str, timeout: float) -> None:
        self.core = core
        self.ns = namespace
        self.timeout = timeout

    def _do(self, what: str, fn: Callable[..., Any], *args: Any, missing_ok: bool = False, **kwargs: Any) -> Any:
        """Call ``fn`` with the request timeout; a 404 is None when ``missing_ok``, else SB009."""
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, _request_timeout=self.timeout, **kwargs)
        except ApiException as e:
            if missing_ok and e.status == 404 and not _status_message(e).startswith("namespaces "):
                return None
            raise api_error(what, self.ns, e) from None
        except Exception as e:  # noqa: BLE001 - urllib3 timeouts, refused connections, DNS
            raise unreachable(what, self.ns, e) from None

    def create_pod(self, body: dict[str, Any]) -> Any:
        return self._do("create pods", self.core.create_namespaced_pod, self.ns, body)

    def get_pod(self, name: str) -> Any | None:
        return self._do("get pods", self.core.read_namespaced_pod, name, self.ns, missing_ok=True)

    def list_pods(self, selector: str) -> list[Any]:
        return list(self._do("list pods", self.core.list_namespaced_pod, self.ns, label_selector=selector).items)

    def patch_pod(self, name: str, body: dict[str, Any], *, missing_ok: bool = False) -> Any:
        """The patched pod; None (nothing logged) for a pod already gone when ``missing_ok``."""
        return self._do("patch pods", self.core.patch_namespaced_pod, name, self.ns, body, missing_ok=missing_ok)

    def delete_pod(self, name: str) -> bool:
        """Delete now (grace 0: a box has nothing to flush); False if it was already gone."""
        done = self._do("delete pods", self.core.delete_namespaced_pod, name, self.ns, grace_period_seconds=0,
                        missing_ok=True)
        return done is not None

    def ensure_configmap(self, body: dict[str, Any]) -> bool:
        """Create the ConfigMap unless it exists; True when this call created it."""
        name = body["metadata"]["name"]
        if self._do("get configmaps", self.core.read_namespaced_config_map, name, self.ns,
                    missing_ok=True) is not None:
            return False
        try:
            self._do("create configmaps", self.core.create_namespaced_config_map, self.ns, body)
        except ProviderUnavailableError as e:
            if e.details.get("status") == 409:  # created meanwhile by another replica: fine
                return False
            raise
        return True

    def warning_events(self, name: str) -> list[str]:
        """The pod's Warning events (``FailedMount: ...``), newest last; none when they cannot be read
        (the Role need not grant ``list events``: this is only a better reason in an error)."""
        try:
            items = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}",
                                                    _request_timeout=self.timeout).items
        except Exception:  # noqa: BLE001 - forbidden, unreachable: the caller has a reason already
            return []
        out = []
        for ev in items or []:
            if ev.type == "Warning" and ev.reason:
                text = f"{ev.reason}: {ev.message or ''}".strip(": ")[:300]
                if text not in out:
                    out.append(text)
        return out

    def list_network_policies(self) -> list[Any]:
        from kubernetes import client as k8s

        net = k8s.NetworkingV1Api(self.core.api_client)
        return list(self._do("list networkpolicies", net.list_namespaced_network_policy, self.ns).items)
