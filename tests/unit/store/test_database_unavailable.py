"""A database that stops answering fails requests within seconds with a retryable 503 SB009,
instead of hanging them (no client-side timeout) or answering 500 SB000 as if it were a bug."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from execbox.errors import ProviderUnavailableError
from execbox.service.errors import install_error_handlers
from execbox.service.store import open_store
from execbox.service.store.engine import PG_CONNECT_TIMEOUT


@pytest.mark.timeout(60)
def test_a_postgres_server_that_never_answers_fails_the_connect_within_its_timeout(tmp_path) -> None:
    with socket.socket() as silent:  # accepts TCP (the kernel does) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(ProviderUnavailableError) as e:
            open_store(tmp_path, url=f"postgresql://execbox:pw-secret@127.0.0.1:{port}/execbox")
        took = time.monotonic() - t0
    assert took < PG_CONNECT_TIMEOUT * 3, took
    assert "pw-secret" not in e.value.message


def test_a_database_error_during_a_request_is_a_retryable_503() -> None:
    app = FastAPI()
    install_error_handlers(app)
    counter = SimpleNamespace(labels=lambda code: SimpleNamespace(inc=lambda: None))
    app.state.services = SimpleNamespace(metrics=SimpleNamespace(errors=counter))

    @app.get("/v1/sandbox/whoami")
    def whoami() -> None:
        raise OperationalError("SELECT ...", {}, Exception("connection to server at 10.0.0.9 (user ops) lost"))

    r = TestClient(app, raise_server_exceptions=False).get("/v1/sandbox/whoami")
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "SB009" and "10.0.0.9" not in r.text
