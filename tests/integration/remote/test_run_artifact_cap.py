"""/run returns at most EXECBOX_EXECUTOR_MAX_ARTIFACT_BYTES of artifacts inline (review 42, finding 2):
default 10 MiB (it was 64 MiB, which concurrent calls multiplied in server memory); what does not fit
is not read from the box and is named in ``detail`` with its size, the cap and the setting; the
setting moves the cap, in `execbox executor` and inside `execbox serve`; a bad value stops the start."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import pytest

from execbox.errors import InvalidConfigError

from .conftest import ThreadedServer, free_port

ENV = "EXECBOX_EXECUTOR_MAX_ARTIFACT_BYTES"
DEFAULT = 10 * 1024 * 1024
MAKE = ("import os\nos.makedirs('artifacts', exist_ok=True)\n"
        "for name, size in {sizes!r}:\n"
        "    open('artifacts/' + name, 'wb').write(b'x' * size)\n")


def _run(client: httpx.Client, sizes: list[tuple[str, int]], **kw: object) -> dict:
    body = {"code_b64": base64.b64encode(MAKE.format(sizes=sizes).encode()).decode(), "language": "python"}
    r = client.post("/run", json=body, **kw)
    assert r.status_code == 200, r.text
    return r.json()


def _skipped_note(name: str, size: int, limit: int) -> str:
    return f"{name}: skipped ({size} bytes), artifacts returned inline are at most {limit} bytes in total ({ENV})"


def test_the_default_cap_leaves_out_what_does_not_fit_and_names_it(client: httpx.Client) -> None:
    big = DEFAULT + 1
    body = _run(client, [("a-big.bin", big), ("b-small.txt", 5)])
    assert body["status"] == "success", body
    assert [(a["name"], a["size"]) for a in body["artifacts"]] == [("b-small.txt", 5)]
    assert base64.b64decode(body["artifacts"][0]["content_b64"]) == b"xxxxx"
    assert body["detail"] == "artifacts not returned: " + _skipped_note("a-big.bin", big, DEFAULT), body["detail"]


@pytest.fixture
def capped_executor(server_provider, monkeypatch) -> Iterator[httpx.Client]:
    from execbox.service.routes.executor_compat import ExecutorAuth, create_executor_app

    monkeypatch.setenv(ENV, "1000")
    app = create_executor_app(server_provider, auth=ExecutorAuth(open=True), owns_provider=False)
    srv = ThreadedServer(app, free_port()).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            yield c
    finally:
        srv.stop()


def test_the_setting_moves_the_cap(capped_executor: httpx.Client) -> None:
    body = _run(capped_executor, [("a.txt", 600), ("b.txt", 600), ("c.txt", 300)])
    assert [a["name"] for a in body["artifacts"]] == ["a.txt", "c.txt"]  # c still fits in what b left
    assert body["detail"] == "artifacts not returned: " + _skipped_note("b.txt", 600, 1000)


def test_zero_returns_no_artifact_inline(server_provider, monkeypatch) -> None:
    from execbox.service.routes.executor_compat import create_executor_app

    monkeypatch.setenv(ENV, "0")
    app = create_executor_app(server_provider, owns_provider=False)
    assert app.state.executor.max_artifact_bytes == 0


def test_the_cap_applies_inside_execbox_serve(server_provider, monkeypatch) -> None:
    from tests.integration.service.conftest import start_service

    monkeypatch.setenv(ENV, "1000")
    svc = start_service(server_provider)
    try:
        with httpx.Client(base_url=svc.url, timeout=60,
                          headers={"Authorization": f"Bearer {svc.tenant_a}"}) as c:
            body = _run(c, [("a.txt", 600), ("b.txt", 600)])
    finally:
        svc.stop()
    assert [a["name"] for a in body["artifacts"]] == ["a.txt"]
    assert _skipped_note("b.txt", 600, 1000) in body["detail"]


@pytest.mark.parametrize("value", ["lots", "-1", "10MiB"])
def test_a_bad_value_stops_the_start(server_provider, monkeypatch, value: str) -> None:
    from execbox.service.routes.executor_compat import create_executor_app

    monkeypatch.setenv(ENV, value)
    with pytest.raises(InvalidConfigError, match=ENV):
        create_executor_app(server_provider, owns_provider=False)
