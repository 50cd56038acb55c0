"""ProviderManager with the real local provider: seeding and env on first boot only, hot reload,
leases keeping a replaced provider alive, fallback order, zero-config."""

from __future__ import annotations

import json
import time

import pytest

from execbox.errors import ConnectionFailedError, InvalidConfigError, ProviderUnavailableError
from execbox.service.crypto import KeyRing, generate_key
from execbox.service.provider_manager import ProviderManager
from execbox.service.store import open_store
from execbox.service.store.sandbox_settings import ACTIVE

SEED = {"system_settings": [
    {"name": "sandbox.provider_type", "source": "variable", "data_type": "string", "value": "local"},
    {"name": "sandbox.local", "source": "variable", "data_type": "json",
     "value": {"timeout": 30, "not_a_local_field": 1}},
    {"name": "sandbox.self_managed", "source": "variable", "data_type": "json",
     "value": "{\"endpoint\": \"http://127.0.0.1:9\", \"max_retries\": 0, \"api_key\": \"\"}"},
]}


@pytest.fixture
def seed(tmp_path):
    path = tmp_path / "seed.json"
    path.write_text(json.dumps(SEED))
    return path


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "data")
    yield s
    s.close()


def make(store, seed, env=None, **kw) -> ProviderManager:
    return ProviderManager(store, keyring=KeyRing(generate_key()), env=env or {}, seed_file=seed, **kw)


def test_seed_and_env_apply_on_first_boot_only(store, seed):
    pc = make(store, seed, env={"SANDBOX_TIMEOUT_SEC": "2m", "E2B_API_KEY": "e2b_0123456789abcdef"})
    assert pc.settings.active() == "local"
    assert pc.settings.effective("local")["timeout"] == 120  # "2m" parsed, applied to the seed
    assert "not_a_local_field" not in pc.settings.stored("local")  # seed filtered by the schema
    assert "api_key" not in pc.settings.stored("self_managed")  # empty seed values are not stored
    e2b = pc.settings.stored("e2b")
    if e2b is not None:  # the e2b module is installed: its key is encrypted on the way in
        assert e2b["api_key"].startswith("enc:v1:")
    pc.shutdown()
    # Second boot: the store is the source of truth; env and seed are ignored.
    version = store.settings.version()
    again = make(store, seed, env={"SANDBOX_TYPE": "self_managed", "SANDBOX_TIMEOUT_SEC": "5"})
    assert again.settings.active() == "local" and again.settings.effective("local")["timeout"] == 120
    assert store.settings.version() == version
    again.shutdown()


def test_sandbox_type_env_selects_the_active_provider_on_first_boot(store, seed):
    pc = make(store, seed, env={"SANDBOX_BACKEND": "self_managed"})
    assert pc.settings.active() == "self_managed"
    pc.shutdown()


def test_hot_reload_rebuilds_only_when_the_config_changed(store, seed):
    pc = make(store, seed)
    first = pc.current()
    assert first.name == "local" and pc.current() is first
    reloads = pc.reloads
    store.settings.set("unrelated", "1")  # version moves, config does not: same object
    assert pc.current() is first and pc.reloads == reloads + 1
    pc.settings.save("local", {"timeout": 5})
    second = pc.current()
    assert second is not first and second.config["timeout"] == 5
    pc.shutdown()


def test_check_interval_throttles_the_version_query(store, seed):
    pc = make(store, seed, check_interval=60)
    p = pc.current()
    pc.settings.save("local", {"timeout": 6})
    assert pc.current() is p  # not re-checked within the interval
    pc.refresh(force=True)
    assert pc.current().config["timeout"] == 6
    pc.shutdown()


def test_replaced_provider_stays_up_while_leased_or_busy(store, seed):
    pc = make(store, seed, retire_grace=0)
    with pc.lease() as old:
        inst = old.create_instance("python")
        pc.settings.save("local", {"timeout": 7})
        assert pc.current() is not old
        time.sleep(0.3)
        pc._sweep()
        assert old.initialized and old in pc.retired()
        # The in-flight work finishes on the provider it started on.
        assert old.execute_code(inst.instance_id, "print(6 * 7)", "python").stdout == "42\n"
        old.destroy_instance(inst.instance_id)
    pc._sweep()
    assert not old.initialized and old not in pc.retired()
    pc.shutdown()


def test_replaced_provider_with_a_live_instance_waits_for_it(store, seed):
    pc = make(store, seed, retire_grace=0)
    old = pc.current()
    inst = old.create_instance("python")  # a session holding a box, no lease
    pc.settings.save("local", {"timeout": 8})
    pc.current()
    pc._sweep()
    assert old.initialized
    old.destroy_instance(inst.instance_id)
    pc._sweep()
    assert not old.initialized
    pc.shutdown()


def _one_shot(provider):
    inst = provider.create_instance("python")
    try:
        return provider.execute_code(inst.instance_id, "print('served')", "python").stdout
    finally:
        provider.destroy_instance(inst.instance_id)


def test_run_with_fallback_moves_on_for_sb003_and_reports_what_was_tried(store, seed):
    pc = make(store, seed)
    pc.settings.set_active("self_managed")  # endpoint on a closed port
    pc.settings.set_fallback(["local"])
    value, served, tried = pc.run_with_fallback(_one_shot)
    assert value == "served\n" and served == "local"
    assert [t["provider"] for t in tried] == ["self_managed"] and tried[0]["code"] == "SB003"
    # The failed provider is now known unhealthy: current() serves with the fallback.
    assert pc.current().name == "local"
    pc.shutdown()


def test_no_fallback_configured_means_no_silent_switch(store, seed):
    pc = make(store, seed)
    pc.settings.set_active("self_managed")
    assert pc.current().name == "self_managed"
    with pytest.raises(ConnectionFailedError) as e:
        pc.run_with_fallback(_one_shot)
    assert e.value.details["tried"][0]["provider"] == "self_managed"
    pc.shutdown()


def test_other_errors_do_not_fall_back(store, seed):
    pc = make(store, seed)
    pc.settings.set_fallback(["self_managed"])
    calls = []

    def bad(provider):
        calls.append(provider.name)
        raise InvalidConfigError("bad input")

    with pytest.raises(InvalidConfigError):
        pc.run_with_fallback(bad)
    assert calls == ["local"]
    pc.shutdown()


def test_unbuildable_active_provider_falls_back(store, seed):
    pc = make(store, seed)
    store.settings.set("sandbox.local", json.dumps({"timeout": "not a number"}))
    pc.settings.set_fallback(["self_managed"])
    with pytest.raises(InvalidConfigError, match="timeout"):
        make(store, seed).settings.effective("local")
    calls = []
    value, served, tried = pc.run_with_fallback(lambda p: calls.append(p.name) or p.name)
    assert served == "self_managed" and tried[0]["provider"] == "local" and tried[0]["code"] == "SB002"
    pc.shutdown()


def test_zero_config_when_nothing_is_stored(store, seed):
    pc = make(store, seed)
    store.settings.set(ACTIVE, "", data_type="string")
    p = pc.current()
    assert p.zero_config and pc.active_name == p.name
    assert pc.selection_note and p.name in pc.selection_note
    pc.shutdown()


def test_all_candidates_unbuildable_raises_with_tried(store, seed, monkeypatch):
    pc = make(store, seed)
    store.settings.set("sandbox.local", json.dumps({"timeout": -1}))
    with pytest.raises(InvalidConfigError) as e:
        pc.run_with_fallback(lambda p: p.name)
    assert e.value.details["tried"][0]["provider"] == "local"
    assert not isinstance(e.value, ProviderUnavailableError)
    pc.shutdown()
