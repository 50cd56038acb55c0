"""What the kubernetes provider's API errors tell a tenant (SB009 messages reach them through the
service's error replies) and what they leave to the server log: no API server address, URL,
namespace, ServiceAccount or kubeconfig path in the message; the operation and the HTTP status
there, the whole error in the log. A missing namespace says so instead of a bare 404."""

from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("kubernetes")

from kubernetes.client.exceptions import ApiException  # noqa: E402

from execbox.boxes.k8s_api import PodApi, core_api  # noqa: E402
from execbox.errors import ProviderUnavailableError  # noqa: E402

NS = "secret-sandbox-ns"
HOST = "10.255.255.1"


def api_exception(status: int, reason: str, message: str) -> ApiException:
    e = ApiException(status=status, reason=reason)
    e.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status})
    return e


class Core:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __getattr__(self, name):
        def call(*args, **kwargs):
            raise self.exc
        return call


def test_unreachable_api_names_the_operation_not_the_server(caplog):
    import urllib3.exceptions

    exc = urllib3.exceptions.MaxRetryError(None, f"/api/v1/namespaces/{NS}/pods",
                                           reason=OSError(f"HTTPSConnectionPool(host='{HOST}', port=6443)"))
    with caplog.at_level(logging.WARNING, "execbox.kubernetes"), pytest.raises(ProviderUnavailableError) as e:
        PodApi(Core(exc), NS, 1).create_pod({"metadata": {"name": "p"}})
    assert "unreachable or too slow (create pods)" in e.value.message
    assert HOST not in e.value.message and NS not in e.value.message and "/api/" not in e.value.message
    assert HOST in caplog.text and NS in caplog.text  # the operator's copy


def test_rbac_refusal_leaves_the_service_account_to_the_log(caplog):
    exc = api_exception(403, "Forbidden", f'pods is forbidden: User "system:serviceaccount:execbox:gateway" '
                                          f'cannot patch resource "pods" in the namespace "{NS}"')
    with caplog.at_level(logging.WARNING, "execbox.kubernetes"), pytest.raises(ProviderUnavailableError) as e:
        PodApi(Core(exc), NS, 1).patch_pod("p", {})
    msg = e.value.message
    assert "refused to patch pods (HTTP 403 Forbidden)" in msg
    assert "serviceaccount" not in msg and NS not in msg and "rbac.yaml" not in msg
    assert "system:serviceaccount:execbox:gateway" in caplog.text and "rbac.yaml" in caplog.text


@pytest.mark.parametrize("call", ["create_pod", "ensure_configmap", "delete_pod", "get_pod"])
def test_missing_namespace_says_so(call):
    exc = api_exception(404, "Not Found", f'namespaces "{NS}" not found')
    api = PodApi(Core(exc), NS, 1)
    with pytest.raises(ProviderUnavailableError) as e:
        getattr(api, call)({"metadata": {"name": "cm"}} if call in ("create_pod", "ensure_configmap") else "p")
    assert "the sandbox namespace does not exist" in e.value.message and NS not in e.value.message


def test_a_missing_pod_is_none_not_an_error():
    exc = api_exception(404, "Not Found", 'pods "p" not found')
    assert PodApi(Core(exc), NS, 1).get_pod("p") is None
    assert PodApi(Core(exc), NS, 1).delete_pod("p") is False


def test_bad_kubeconfig_path_stays_in_the_log(tmp_path, caplog):
    path = tmp_path / "very-secret-dir" / "kubeconfig"
    path.parent.mkdir()
    path.write_text("clusters: [\n  - {name: x\n")  # broken YAML
    with caplog.at_level(logging.WARNING, "execbox.kubernetes"), pytest.raises(ProviderUnavailableError) as e:
        core_api(str(path), "")
    assert "very-secret-dir" not in e.value.message and "cannot load the cluster configuration" in e.value.message
    assert "very-secret-dir" in caplog.text
