"""Fallback when a real remote executor dies; wrong key and key rotation across processes;
concurrent admin writes keep one consistent row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from execbox.errors import SandboxError
from execbox.service.app import create_app
from execbox.service.config import ServiceSettings
from execbox.service.crypto import KeyRing, SecretKeyError, generate_key
from execbox.service.provider_manager import ProviderManager
from execbox.service.store import open_store

from .helpers import keyring, write_seed
from .test_two_processes import free_port

EXECBOX = str(Path(sys.executable).with_name("execbox"))


def _one_shot(provider):
    inst = provider.create_instance("python")
    try:
        return provider.execute_code(inst.instance_id, "print(6 * 7)", "python").stdout
    finally:
        provider.destroy_instance(inst.instance_id)


@pytest.fixture
def executor_process(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SANDBOX_", "EXECBOX_"))}
    log = open(tmp_path / "executor.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([EXECBOX, "executor", "--host", "127.0.0.1", "--port", str(port),
                             "--provider", "local", "--log-level", "warning"], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        proc.kill()
        raise AssertionError((tmp_path / "executor.log").read_text())
    yield proc, url
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def test_fallback_when_the_active_provider_is_made_unhealthy(db_url, tmp_path, executor_process):
    proc, url = executor_process
    with open_store(tmp_path, url=db_url) as store:
        pc = ProviderManager(store, keyring=keyring(), env={}, seed_file=write_seed(tmp_path))
        try:
            pc.settings.save("self_managed", pc.settings.validate("self_managed",
                                                                  {"endpoint": url, "max_retries": 1}),
                             set_active=True)
            pc.settings.set_fallback(["local"])
            value, served, tried = pc.run_with_fallback(_one_shot)
            assert (value, served, tried) == ("42\n", "self_managed", []), (value, served, tried)
            assert pc.current().name == "self_managed"

            proc.kill()  # the remote executor dies
            proc.wait(10)
            value, served, tried = pc.run_with_fallback(_one_shot)
            assert value == "42\n" and served == "local"
            assert tried[0]["provider"] == "self_managed" and tried[0]["code"] in ("SB003", "SB009")
            assert pc.current().name == "local"  # new executions go straight to the healthy one
        finally:
            pc.shutdown()


def test_wrong_key_is_a_clear_error_and_never_leaks(db_url, tmp_path):
    secret = "e2b-like-0123456789-SECRET"
    with open_store(tmp_path, url=db_url) as store:
        right = ProviderManager(store, keyring=keyring(), env={}, seed_file=write_seed(tmp_path))
        right.settings.save("self_managed", right.settings.validate(
            "self_managed", {"endpoint": "http://127.0.0.1:9", "api_key": secret}), set_active=True)
        right.shutdown()

        wrong = ProviderManager(store, keyring=KeyRing(generate_key(), "EXECBOX_SECRET_KEY"), env={})
        with pytest.raises(SecretKeyError) as e:
            wrong.current()
        assert "EXECBOX_SECRET_KEY" in e.value.message and secret not in str(e.value.details)
        app = create_app(store=store, providers=wrong, settings=ServiceSettings())
        _, admin = store.tokens.create("ops", "admin")
        with TestClient(app) as client:
            client.headers["Authorization"] = f"Bearer {admin}"
            cfg = client.get("/api/admin/sandbox/config")
            assert cfg.status_code == 200 and secret not in cfg.text
            assert "cannot decrypt" in cfg.json()["self_managed"]["error"]["message"]
            r = client.post("/v1/sandbox/execute", json={"code": "print(1)"})
            assert r.status_code == 500 and r.json()["error"]["code"] == "SB002"
            assert "cannot decrypt" in r.json()["error"]["message"] and secret not in r.text
        wrong.shutdown()


def test_rotation_by_cli_keeps_secrets_readable_by_a_running_process(tmp_path):
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SANDBOX_", "EXECBOX_"))}
    env["EXECBOX_DATA_DIR"] = str(data)
    secret = "rotate-me-0123456789abcd"
    subprocess.run([EXECBOX, "config", "set", "self_managed", "endpoint=http://127.0.0.1:9",
                    f"api_key={secret}"], env=env, check=True, capture_output=True)
    with open_store(data) as store:
        running = ProviderManager(store, env={})  # key loaded from the key file, like a server
        assert running.settings.decrypted("self_managed")["api_key"] == secret
        before = store.settings.get("sandbox.self_managed")
        out = subprocess.run([EXECBOX, "secrets", "rotate"], env=env, check=True, capture_output=True, text=True)
        assert "re-encrypted 1 secret" in out.stdout
        after = store.settings.get("sandbox.self_managed")
        old_id, new_id = json.loads(before)["api_key"].split(":")[2], json.loads(after)["api_key"].split(":")[2]
        assert old_id != new_id and not (data / "secret.key.new").exists()
        # The running process held the old key: it reloads the key file and still decrypts.
        assert running.settings.decrypted("self_managed")["api_key"] == secret
        shown = subprocess.run([EXECBOX, "config", "show", "self_managed"], env=env, check=True,
                               capture_output=True, text=True).stdout
        assert "****abcd" in shown and secret not in shown
        running.shutdown()


def test_concurrent_admin_writes_keep_one_consistent_row(db_url, tmp_path):
    with open_store(tmp_path, url=db_url) as store:
        pc = ProviderManager(store, keyring=keyring(), env={}, seed_file=write_seed(tmp_path))
        app = create_app(store=store, providers=pc, settings=ServiceSettings())
        _, admin = store.tokens.create("ops", "admin")
        errors: list[str] = []
        with TestClient(app) as client:
            client.headers["Authorization"] = f"Bearer {admin}"

            def write(i: int) -> None:
                cfg = {"endpoint": f"http://127.0.0.1:9/w{i}", "timeout": i + 1,
                       "api_key": f"writer-{i:03d}-secret-value"}
                r = client.post("/api/admin/sandbox/config",
                                json={"provider_type": "self_managed", "config": cfg, "set_active": i % 2 == 0})
                if r.status_code != 200:
                    errors.append(r.text)

            threads = [threading.Thread(target=write, args=(i,)) for i in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert errors == []
        final = pc.settings.decrypted("self_managed")
        i = final["timeout"] - 1
        assert final == {"endpoint": f"http://127.0.0.1:9/w{i}", "timeout": i + 1,
                         "api_key": f"writer-{i:03d}-secret-value"}
        pc.shutdown()


def test_unreachable_database_is_a_clear_error(tmp_path):
    port = free_port()
    with pytest.raises(SandboxError) as e:
        open_store(tmp_path, url=f"postgresql://execbox:hunter2pass@127.0.0.1:{port}/x")
    assert e.value.code == "SB009" and "unreachable" in e.value.message
    assert "hunter2pass" not in e.value.message and "****" in e.value.message
