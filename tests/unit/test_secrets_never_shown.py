"""Secrets never appear in errors, logs or API answers: at most ``****`` + the last 4 characters,
nothing of a secret under 12 characters (review 36: F1-F3, F5, F6, F8, F9).

- F1: a package index URL with credentials is refused without quoting it, at ``serve`` start, and a
  tenant's install only learns that the operator's setting is invalid;
- F2: self_managed relays the remote's errors without its api_key (a remote may echo it), a 401/403
  as SB003 without the body, an unknown code as SB009;
- F3: one scrubbing rule (redaction.scrub) for e2b/aliyun errors and the admin's provider test;
- F5: docker_host refuses a password and the engine error hides URL userinfo;
- F6: an unparsable EXECBOX_DATABASE_URL is refused without the parser's text;
- F8: network_credentials shows as ``****``;
- F9: the SDK's errors show the service URL without its userinfo.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from execbox.errors import ConnectionFailedError, InvalidConfigError, SandboxError
from execbox.redaction import scrub

from .client_fakes import answer


def shown(err: SandboxError) -> str:
    return json.dumps(err.to_dict(), default=str)


# -- F3: the one rule --------------------------------------------------------------------------------


def test_scrub_replaces_secrets_of_any_length_with_their_redacted_form():
    assert scrub("key e2b_abcdef123456 failed", ["e2b_abcdef123456"]) == "key ****3456 failed"
    assert scrub("bad key sk1234567!", ["sk1234567"]) == "bad key ****!"  # 9 characters: none shown
    assert scrub("invalid credentials {'x-api-key': 'k9Z2x'}", ["k9Z2x"]) == "invalid credentials {'x-api-key': '****'}"
    assert scrub("'Bearer abc'", ["abc"]) == "'Bearer ****'"  # a short secret as a whole token
    # ... but not inside other words: a 1-3 character secret would wreck (and so reveal) the message
    assert scrub("a message about abcdef", ["a", "abc"]) == "**** message about abcdef"
    assert scrub("nothing", [None, "", "  "]) == "nothing"


def test_scrub_recurses_and_finds_nested_secrets():
    creds = json.dumps({"api.example.com": {"Authorization": "Bearer TOKENvalue0123456789", "X-K": "k3y"}})
    value = {"message": "sent TOKENvalue0123456789 and k3y", "details": [{"echo": "k3y"}, 7, None]}
    out = scrub(value, [creds, {"agent_secret": "agentSECRET-0123456789"}])
    assert out == {"message": "sent ****6789 and ****", "details": [{"echo": "****"}, 7, None]}
    assert scrub("agentSECRET-0123456789", [{"a": ["agentSECRET-0123456789"]}]) == "****6789"


def test_mask_secrets_uses_the_documented_rule():
    from execbox.providers.cloud_errors import mask_secrets

    assert mask_secrets("e2b said: invalid key 'k9Z2x'", ["k9Z2x", None]) == "e2b said: invalid key '****'"
    assert mask_secrets("key sk1234567", ["sk1234567"]) == "key ****"
    assert mask_secrets("key e2b_abcdef123456", ["e2b_abcdef123456"]) == "key ****3456"


class _Failing:
    """A provider whose first call fails with a message quoting its config, as an echoing remote does."""

    def __init__(self, text: str) -> None:
        self.text = text

    def get_supported_languages(self):
        return ["python"]

    def create_instance(self, lang):
        raise ConnectionFailedError(self.text, details={"echo": self.text})

    def shutdown(self):
        pass


def test_provider_test_scrubs_only_secret_fields_at_any_length(monkeypatch):
    from execbox.providers import registry
    from execbox.service.provider_probe import probe

    config = {"api_key": "sk1234567", "api_url": "http://127.0.0.1:1", "sandbox_url": "http://127.0.0.1:1"}
    text = "refused {'x-api-key': 'sk1234567'} at http://127.0.0.1:1"
    monkeypatch.setattr(registry, "create_provider", lambda name, cfg: _Failing(text))
    out = probe("e2b", config)
    assert out["message"] == "SB003: refused {'x-api-key': '****'} at http://127.0.0.1:1"  # the URL stays
    assert "4567" not in json.dumps(out)


def test_provider_test_scrubs_nested_network_credentials(monkeypatch):
    from execbox.providers import registry
    from execbox.service.provider_probe import probe

    config = {"network": "allowlist", "network_allow": "api.example.com",
              "network_credentials": json.dumps({"api.example.com": {"X-Key": "k3y"}})}
    monkeypatch.setattr(registry, "create_provider", lambda name, cfg: _Failing("upstream said k3y is wrong"))
    out = probe("jail", config)
    assert "k3y" not in json.dumps(out) and "upstream said **** is wrong" in out["message"]


# -- F8: network_credentials is shown as **** ----------------------------------------------------------


def test_network_credentials_show_as_stars_and_round_trip(tmp_path):
    from execbox.service.crypto import KeyRing, generate_key
    from execbox.service.store import open_store
    from execbox.service.store.sandbox_settings import SandboxSettings

    creds = json.dumps({"api.example.com": {"X-Key": "k3y"}})
    store = open_store(tmp_path)
    try:
        s = SandboxSettings(store, KeyRing(generate_key(), "test key"))
        net = {"network": "allowlist", "network_allow": "api.example.com"}
        s.save("docker", {**net, "network_credentials": creds})
        assert s.redacted("docker")["network_credentials"] == "****"  # not '****y"}}'
        # the console sends the shown value back unchanged: the stored secret is kept
        assert s.validate("docker", {**net, "network_credentials": "****"})["network_credentials"] == creds
        s.save("docker", {**net, "network_credentials": ""})
        assert s.redacted("docker")["network_credentials"] == ""
    finally:
        store.close()


# -- F1: package index URLs with credentials -------------------------------------------------------------

MIRROR = "https://__token__:glpat-MIRRORsecret4242@gitlab.example.com/api/v4/projects/1/packages/pypi/simple"


@pytest.mark.parametrize("field", ["EXECBOX_PIP_INDEX_URL", "EXECBOX_NPM_REGISTRY"])
def test_an_index_url_with_credentials_is_refused_naming_only_the_variable_and_host(field):
    from execbox.boxes.runtime_build import check_index_url

    with pytest.raises(InvalidConfigError) as e:
        check_index_url(MIRROR, field)
    text = shown(e.value)
    assert "MIRRORsecret4242" not in text and "__token__" not in text and "/api/v4" not in text
    assert field in e.value.message and "https://gitlab.example.com/…" in e.value.message
    assert e.value.details == {"field": field}
    assert check_index_url("https://pypi.internal:8443/simple", field) == "https://pypi.internal:8443/simple"


@pytest.mark.parametrize("bad", ["glpat-TOKENonly0123", "ftp://mirror.example/simple", "https://[::1/simple",
                                 "https://:pw0123456@host/simple"])
def test_a_bad_index_url_is_never_echoed(bad):
    from execbox.boxes.runtime_build import check_index_url

    with pytest.raises(InvalidConfigError) as e:
        check_index_url(bad, "EXECBOX_PIP_INDEX_URL")
    assert bad not in shown(e.value) and "TOKENonly" not in shown(e.value) and "pw0123456" not in shown(e.value)


def test_a_tenants_install_says_the_operators_setting_is_invalid(monkeypatch):
    from execbox.providers.install import run_install

    monkeypatch.setenv("EXECBOX_NPM_REGISTRY", MIRROR)
    with pytest.raises(InvalidConfigError) as e:
        run_install(object(), "inst", ["requests"], None)  # refused before any box is touched
    assert "operator's package index setting EXECBOX_NPM_REGISTRY is invalid" in e.value.message
    assert "MIRRORsecret4242" not in shown(e.value) and "gitlab.example.com" not in shown(e.value)


def test_serve_refuses_to_start_with_such_an_index_url(monkeypatch, tmp_path):
    from execbox.cli import app
    from execbox.service import store

    def opened(*_a, **_k):
        raise RuntimeError("serve went on to open the store")  # (and would have served)

    monkeypatch.setattr(store, "open_store", opened)

    env = {"EXECBOX_DATA_DIR": str(tmp_path / "d"), "EXECBOX_PIP_INDEX_URL": MIRROR, "COLUMNS": "200"}
    r = CliRunner().invoke(app, ["serve", "--port", "0"], env=env)
    assert r.exit_code == 2, r.output
    assert "SB002" in r.output and "EXECBOX_PIP_INDEX_URL" in r.output
    assert "MIRRORsecret4242" not in r.output
    assert not (tmp_path / "d").exists()  # refused before anything was made (no token printed)


# -- F2: self_managed relays the remote's errors without its api_key ---------------------------------------

KEY = "SMtokenLONGsecretVALUE5555"


def _error_of(url: str, api: str, key: str = KEY) -> SandboxError:
    from execbox.providers.self_managed import SelfManagedProvider

    p = SelfManagedProvider()
    p.initialize({"endpoint": url, "max_retries": 0, "api": api, "api_key": key})
    inst = p.create_instance()
    try:
        with pytest.raises(SandboxError) as e:
            p.execute_code(inst.instance_id, "print(1)", "python", 5)
        return e.value
    finally:
        p.shutdown()


@pytest.mark.parametrize("api", ["execbox", "run"])
@pytest.mark.parametrize("status", ["401 Unauthorized", "403 Forbidden"])
def test_a_refused_key_is_sb003_without_the_remotes_body(serve, api, status):
    body = json.dumps({"error": {"code": "SB002", "message": f"invalid credentials {{'Authorization': 'Bearer {KEY}'}}",
                                 "details": {"got": KEY}}})
    err = _error_of(serve(answer(body, status)).url, api)
    assert err.code == "SB003" and "self_managed.api_key" in err.message
    assert KEY not in shown(err) and "5555" not in shown(err) and "invalid credentials" not in shown(err)


@pytest.mark.parametrize("api", ["execbox", "run"])
@pytest.mark.parametrize("code", ["SB004", "", "SB000", "XX9"])
def test_the_remotes_error_is_relayed_scrubbed_and_never_sb000(serve, api, code):
    body = json.dumps({"error": {"code": code, "message": f"no box for key {KEY}",
                                 "details": {"echo": KEY, "nested": [f"Bearer {KEY}"]}}})
    err = _error_of(serve(answer(body, "500 Internal Server Error")).url, api)
    assert err.code == (code if code == "SB004" else "SB009")
    assert KEY not in shown(err) and "no box for key ****5555" in err.message
    assert err.details["echo"] == "****5555"


def test_a_non_json_error_body_is_scrubbed_and_sb009(serve):
    err = _error_of(serve(answer(f"proxy error: token {KEY} rejected", "502 Bad Gateway", "text/plain")).url,
                    "execbox")
    assert err.code == "SB009" and KEY not in shown(err)


def test_a_short_key_is_scrubbed_whole(serve):
    body = json.dumps({"error": {"code": "SB002", "message": "unknown key 'abc'", "details": {"key": "abc"}}})
    err = _error_of(serve(answer(body, "400 Bad Request")).url, "execbox", key="abc")
    assert err.code == "SB002" and err.message == "unknown key '****'" and err.details == {"key": "****"}


# -- F5: docker_host -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "unix:///var/run/docker.sock", "tcp://10.0.0.1:2376", "ssh://deploy@host",
                                   "npipe:////./pipe/docker_engine", "https://docker.internal:2376"])
def test_usable_docker_hosts_pass(value):
    from execbox.providers.docker import DockerProvider

    assert DockerProvider().validate_config({"docker_host": value, "max_memory": "512m"}) == (True, None)


@pytest.mark.parametrize("value", ["tcp://u:DOCKERpass12@10.0.0.1:2376", "ssh://u:DOCKERpass12@host",
                                   "tcp://DOCKERpass12@10.0.0.1:2376", "tcp://10.0.0.1:2376?token=DOCKERpass12",
                                   "tcp://10.0.0.1:2376#DOCKERpass12", "ftp://DOCKERpass12", "DOCKERpass12:2376",
                                   "tcp://10.0.0.1:DOCKERpass12"])
def test_docker_host_with_credentials_or_junk_is_refused_without_echo(value):
    from execbox.providers.docker import DockerProvider

    ok, message = DockerProvider().validate_config({"docker_host": value, "max_memory": "512m"})
    assert not ok and message.startswith("docker_host") and "DOCKERpass12" not in message


def test_the_engine_error_hides_url_userinfo(monkeypatch):
    from execbox.errors import ProviderUnavailableError
    from execbox.providers import docker as docker_provider
    from execbox.providers import docker_prepare

    def refuse(base_url="", timeout=30.0):
        raise ValueError(f"Invalid bind address format: {base_url}")  # what docker-py says

    monkeypatch.setattr(docker_prepare, "docker_client", refuse)  # prepare() reaches the engine there
    p = docker_provider.DockerProvider()
    p.config = {"docker_host": "tcp://u:DOCKERpass12@10.0.0.1:2376"}  # stored before validation existed
    with pytest.raises(ProviderUnavailableError) as e:
        p.prepare()
    assert "DOCKERpass12" not in shown(e.value)
    assert e.value.message == "docker engine not reachable: Invalid bind address format: tcp://****@10.0.0.1:2376"


# -- F6: an unparsable database URL ------------------------------------------------------------------------------


def test_an_unparsable_database_url_is_refused_without_the_parsers_text(tmp_path):
    from execbox.service.store import open_store

    url = "postgresql://app:Xy@z:TopSecretRest99@db.internal:5432/execbox"
    with pytest.raises(InvalidConfigError) as e:
        open_store(tmp_path, url=url)
    text = shown(e.value)
    assert "TopSecret" not in text and "Rest99" not in text and "Xy@z" not in text
    assert "EXECBOX_DATABASE_URL" in e.value.message and "percent-encode" in e.value.message


# -- F9: the SDK's errors -------------------------------------------------------------------------------------


def test_sdk_errors_show_the_url_without_userinfo():
    from execbox.sdk.remote import RemoteSandbox
    from execbox.sdk.remote_async import AsyncRemoteSandbox

    url = "http://u:URLpw1234@127.0.0.1:1"
    with pytest.raises(ConnectionFailedError) as e:
        RemoteSandbox(url, "tok").run_code("print(1)")
    assert "URLpw1234" not in shown(e.value) and "execbox at http://127.0.0.1:1" in e.value.message

    async def run() -> None:
        sb = AsyncRemoteSandbox(url, "tok")
        try:
            await sb.run_code("print(1)")
        finally:
            await sb.close()

    with pytest.raises(ConnectionFailedError) as e:
        asyncio.run(run())
    assert "URLpw1234" not in shown(e.value)
