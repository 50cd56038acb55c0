"""New session settings parse strictly; forwarded-request signatures bind method, path, body and time."""

from __future__ import annotations

import time

import pytest

from execbox.errors import InvalidConfigError
from execbox.service.config import ServiceSettings
from execbox.service.forwarding import sign, verify


def test_session_settings_from_env() -> None:
    s = ServiceSettings.from_env({"EXECBOX_REPLICA_ID": "r1", "EXECBOX_SESSION_LEASE": "5s",
                                  "EXECBOX_PAUSED_RETENTION": "2h", "SANDBOX_IDLE_ACTION": "pause",
                                  "EXECBOX_DRAIN_TIMEOUT": "1m", "EXECBOX_REPLICA_URL": "http://a:1"})
    assert (s.replica_id, s.lease_ttl, s.paused_retention, s.idle_action, s.drain_timeout, s.replica_url) == (
        "r1", 5.0, 7200.0, "pause", 60.0, "http://a:1")
    assert ServiceSettings.from_env({}).paused_retention == 86400.0
    with pytest.raises(InvalidConfigError) as e:
        ServiceSettings.from_env({"SANDBOX_IDLE_ACTION": "explode"})
    assert e.value.details["field"] == "SANDBOX_IDLE_ACTION"


def test_forwarding_signature_binds_everything() -> None:
    stamp = f"{time.time():.3f}"
    mac = sign("k", "ra", stamp, "POST", "/v1/sandbox/read", b'{"a":1}')
    header = f"ra:{stamp}:{mac}"
    assert verify("k", header, "POST", "/v1/sandbox/read", b'{"a":1}')
    assert not verify("other", header, "POST", "/v1/sandbox/read", b'{"a":1}')  # wrong secret
    assert not verify("k", header, "POST", "/v1/sandbox/write", b'{"a":1}')  # another path
    assert not verify("k", header, "POST", "/v1/sandbox/read", b'{"a":2}')  # another body
    assert not verify("k", header, "POST", "/v1/sandbox/read", b'{"a":1}', now=time.time() + 120)  # stale
    assert not verify("k", "garbage", "POST", "/", b"")
