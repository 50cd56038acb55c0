"""When a Docker one-shot stops waiting for the warm pool: only when the pool's newest refill failed
because the engine is not there (review 43 F7): a refill that timed out on a slow engine, an older
failure, or one a later start cured do not end the wait."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import requests

from execbox.boxes.docker_removals import engine_down as _engine_down


def _pool(e: Exception | None, failures: int = 1, at: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(last_exception=e, consecutive_failures=failures,
                           last_error_at=time.time() if at is None else at)


@pytest.mark.parametrize("e", [requests.exceptions.ConnectionError("refused"),
                               ConnectionRefusedError(111, "refused")])
def test_a_refused_or_missing_engine_ends_the_wait(e: Exception) -> None:
    assert _engine_down(_pool(e), time.time() - 5)


@pytest.mark.parametrize("e", [requests.exceptions.ReadTimeout("slow"), requests.exceptions.ConnectTimeout("slow"),
                               TimeoutError("slow"), RuntimeError("image gone")])
def test_a_slow_engine_or_another_failure_does_not(e: Exception) -> None:
    assert not _engine_down(_pool(e), time.time() - 5)


def test_an_older_or_cured_failure_does_not() -> None:
    refused = requests.exceptions.ConnectionError("refused")
    assert not _engine_down(_pool(refused, at=time.time() - 60), time.time() - 5)  # before this wait began
    assert not _engine_down(_pool(refused, failures=0), time.time() - 5)  # a start since succeeded


def test_the_engine_check_says_a_missing_engine_does_not_answer(tmp_path) -> None:
    """The check's client is made without asking the engine its API version (review 46 F1: made
    lazily while the engine was down, its making failed with an error the check took for "answers")."""
    from execbox.providers.docker import DockerProvider
    from execbox.providers.docker_config import docker_client

    p = DockerProvider()
    p._pinger = docker_client(f"unix://{tmp_path}/no-engine.sock", timeout=2, version="1.41")  # no request
    assert p._engine_answers() is False
    p._pinger = None  # shut down: nothing to ask, the pool's own wait decides
    assert p._engine_answers() is True
