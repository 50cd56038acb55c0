"""The egress proxy's parsing and authentication pieces (egress/proxy_http.py) and the kubernetes config checks."""

from __future__ import annotations

import base64

import pytest

from execbox.boxes import k8s_spec as ks
from execbox.egress.proxy_http import BadRequest, parse_credentials, parse_request, parse_target
from execbox.providers.kubernetes_egress import egress_problem


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_credentials():
    assert parse_credentials(basic("pod-a", "tok:en")) == ("pod-a", "tok:en")
    assert parse_credentials("basic " + base64.b64encode(b"p:t").decode()) == ("p", "t")
    for bad in (None, "", "Bearer abc", "Basic !!!notbase64", "Basic " + base64.b64encode(b"nocolon").decode(),
                "Basic " + base64.b64encode(b":pw").decode(), "Basic " + base64.b64encode(b"\xff\xfe:x").decode()):
        assert parse_credentials(bad) is None, bad


def test_target():
    assert parse_target("Example.COM.:443", None) == ("example.com", 443)
    assert parse_target("203.0.113.5:8080", None) == ("203.0.113.5", 8080)
    assert parse_target("example.com", 80) == ("example.com", 80)
    for bad in ("example.com", "[::1]:443", "example.com:0", "example.com:70000", "example.com:x",
                "exa mple.com:80", "-bad.com:80", "a/b:80", ":80", "user@host:80"):
        with pytest.raises(BadRequest):
            parse_target(bad, None)


def test_connect_request():
    head = (f"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n"
            f"Proxy-Authorization: {basic('pod', 'secret')}\r\n\r\n").encode()
    req = parse_request(head)
    assert (req.method, req.host, req.port, req.head, req.credentials) == (
        "CONNECT", "api.example.com", 443, b"", ("pod", "secret"))


def test_absolute_form_is_rewritten_to_origin_form():
    head = (f"POST http://api.example.com:8080/v1/x?q=1 HTTP/1.1\r\nHost: other.example\r\n"
            f"Proxy-Authorization: {basic('pod', 'secret')}\r\nProxy-Connection: keep-alive\r\n"
            "Connection: keep-alive\r\nKeep-Alive: 300\r\nContent-Length: 3\r\nX-Mine: yes\r\n\r\n").encode()
    req = parse_request(head)
    assert (req.host, req.port, req.credentials) == ("api.example.com", 8080, ("pod", "secret"))
    lines = req.head.decode().split("\r\n")
    assert lines[0] == "POST /v1/x?q=1 HTTP/1.1"
    assert "Host: api.example.com:8080" in lines and "other.example" not in req.head.decode()  # RFC 9112 3.2.2
    lower = [line.lower() for line in lines]
    assert not [x for x in lower if x.startswith(("proxy-", "keep-alive"))], lines
    assert "connection: close" in lower and "connection: keep-alive" not in lower
    assert "x-mine: yes" in lower and "content-length: 3" in lower and req.head.endswith(b"\r\n\r\n")
    # no Host header: one is added from the URL; default port 80
    req = parse_request(b"GET http://h.example/ HTTP/1.0\r\n\r\n")
    assert (req.host, req.port, req.credentials) == ("h.example", 80, None)
    assert b"Host: h.example\r\n" in req.head


@pytest.mark.parametrize("head", [
    b"GET /origin-form HTTP/1.1\r\nHost: x\r\n\r\n",  # not a proxy request
    b"GET https://x.example/ HTTP/1.1\r\n\r\n",  # https goes through CONNECT
    b"GET http://user:pw@x.example/ HTTP/1.1\r\n\r\n",
    b"GET http://[::1]/ HTTP/1.1\r\n\r\n",
    b"CONNECT x.example HTTP/1.1\r\n\r\n",
    b"garbage\r\n\r\n",
    b"GET http://x.example/ HTTP/1.1\r\nno-colon-header\r\n\r\n",
    b"GET http://x.example/ HTTP/2\r\n\r\n",
    b"GET http://x.example/ HTTP/1.9\r\n\r\n",
    b"GET http://x.example/ HTTP/1.1\x00\r\n\r\n",
    # a bare LF would let a second Host (or anything) through to the upstream as its own line
    b"GET http://x.example/ HTTP/1.1\r\nX-A: 1\nHost: evil.example\r\n\r\n",
    b"GET http://x.example/ HTTP/1.1\r\nX-A: 1\rB\r\n\r\n",
])
def test_bad_requests(head):
    with pytest.raises(BadRequest):
        parse_request(head)


def test_egress_token_is_per_pod_and_not_the_agent_token():
    s = b"shared-secret"
    assert ks.egress_token(s, "pod-a") != ks.pod_token(s, "pod-a")
    assert ks.egress_token(s, "pod-a") != ks.egress_token(s, "pod-b")
    assert ks.egress_token(s, "pod-a") == ks.egress_token(s, "pod-a")
    env = {e["name"]: e["value"] for e in ks.proxy_env("gw.svc:15080", "pod-a", "tok")}
    assert set(env) == {*ks.PROXY_ENV, "NO_PROXY", "no_proxy"} and env["no_proxy"] == "localhost,127.0.0.1,::1"
    assert env["https_proxy"] == "http://pod-a:tok@gw.svc:15080"


def test_pod_manifest_carries_the_proxy_env_only_with_a_proxy():
    t = ks.PodTemplate(namespace="ns", image="img", egress_proxy="gw:15080")

    def env(t, **kw):
        body = ks.pod_manifest(t, name="p", token="agent", configmap="cm", labels={}, annotations={}, **kw)
        return {e["name"]: e["value"] for e in body["spec"]["containers"][0]["env"]}

    assert env(t, egress_token="et")["HTTP_PROXY"] == "http://p:et@gw:15080"
    assert "HTTP_PROXY" not in env(ks.PodTemplate(namespace="ns", image="img"), egress_token="et")


@pytest.mark.parametrize("config, field", [
    ({"network": "allowlist", "network_allow": ["api.example.com"]}, "egress_proxy"),  # no proxy address
    ({"network": "bogus", "egress_proxy": "gw:1"}, "network"),
    ({"network": "allowlist", "network_allow": ["http://x/"], "egress_proxy": "gw:1"}, "network_allow"),
    ({"network": "open", "egress_proxy": "gw"}, "egress_proxy"),
    ({"network": "open", "egress_proxy": "gw:1", "egress_proxy_listen": "nope"}, "egress_proxy_listen"),
])
def test_kubernetes_egress_config_problems(config, field):
    problem = egress_problem({"egress_proxy_listen": "", **config})
    assert problem and problem.startswith(field + ":"), problem


def test_kubernetes_egress_config_ok():
    assert egress_problem({"network": "none", "egress_proxy": "", "egress_proxy_listen": "0.0.0.0:15080"}) is None
    assert egress_problem({"network": "allowlist", "network_allow": ["*.pypi.org:443"],
                           "egress_proxy": "execbox-egress.execbox.svc:15080", "egress_proxy_listen": ""}) is None


def test_kubernetes_refuses_network_credentials():
    from execbox.errors import InvalidConfigError
    from execbox.providers.kubernetes import KubernetesProvider

    with pytest.raises(InvalidConfigError) as e:
        KubernetesProvider().initialize({"network": "allowlist", "network_allow": ["api.example.com"],
                                         "egress_proxy": "gw:15080",
                                         "network_credentials": '{"api.example.com": {"Authorization": "x"}}'})
    assert e.value.code == "SB002" and e.value.details["field"] == "network_credentials"
    assert "not available on kubernetes" in e.value.message and "Authorization" not in e.value.message


def test_kubernetes_refuses_the_install_api_clearly():
    from execbox.errors import InvalidConfigError
    from execbox.providers.kubernetes import KubernetesProvider

    with pytest.raises(InvalidConfigError) as e:
        KubernetesProvider().install_packages("t:s:i", pip=["requests"])
    assert e.value.code == "SB002" and "not available on kubernetes" in e.value.message
