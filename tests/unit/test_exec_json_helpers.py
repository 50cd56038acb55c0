"""The pieces of `execbox exec --json` that bound its reply: stdin read up to a limit, artifact
bytes under one budget (a failing fetch costs that artifact only), unexpected errors as SB000."""

from __future__ import annotations

import hashlib
import io

import pytest

from execbox.cli._exec_json import attach_artifacts, internal_error, read_request
from execbox.errors import InvalidConfigError, PayloadTooLargeError
from execbox.models import Artifact


def _art(name: str, data: bytes, fetch=None) -> Artifact:  # noqa: ANN001
    fetched: list[str] = []

    def fetcher(path: str) -> bytes:
        fetched.append(path)
        if fetch is not None:
            return fetch(path)
        return data

    a = Artifact(name, "application/octet-stream", len(data), hashlib.sha256(data).hexdigest(), name,
                 _fetcher=fetcher)
    a.fetched = fetched  # type: ignore[attr-defined]
    return a


def test_read_request_stops_at_the_limit() -> None:
    assert read_request(io.BytesIO(b"x" * 10), limit=10) == b"x" * 10
    stream = io.BytesIO(b"x" * 1000)
    with pytest.raises(PayloadTooLargeError) as e:
        read_request(stream, limit=10)
    assert e.value.details == {"field": "request", "limit": 10} and stream.tell() == 11


def test_artifacts_share_one_budget_and_oversized_ones_are_never_fetched() -> None:
    small, mid, big = _art("s", b"a" * 10), _art("m", b"b" * 60), _art("b", b"c" * 500)
    out, warnings = attach_artifacts([small, big, mid], budget=64)
    assert [("content_b64" in d, "content_omitted" in d) for d in out] == [(True, False), (False, True),
                                                                           (False, True)]
    assert big.fetched == [] and mid.fetched == []  # over what was left: not read at all
    assert len(warnings) == 2 and "'b'" in warnings[0] and "'m'" in warnings[1]


def test_a_failing_fetch_costs_only_its_artifact() -> None:
    def refuse(path: str) -> bytes:
        raise InvalidConfigError("file is larger than 64 MiB")

    def crash(path: str) -> bytes:
        raise OSError("secret-path-detail")

    ok = _art("ok", b"fine")
    out, warnings = attach_artifacts([_art("r", b"x", refuse), _art("c", b"y", crash), ok], budget=100)
    assert "content_b64" in out[2] and "content_b64" not in out[0] and "content_b64" not in out[1]
    assert "SB002" in warnings[0] and warnings[1].endswith("OSError")
    assert "secret-path-detail" not in " ".join(warnings)


def test_internal_error_names_only_the_exception_type() -> None:
    err = internal_error(TypeError("api_key=e2b_topsecret"))
    assert err.code == "SB000" and "topsecret" not in err.message and "TypeError" in err.message


def test_an_unexpected_failure_is_an_sb000_reply_with_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    from execbox.cli import app
    from execbox.cli import run as run_cli

    def boom(request: object) -> dict:
        raise AttributeError("'int' object has no attribute 'lower'")

    monkeypatch.setattr(run_cli, "handle_exec_request", boom)
    res = CliRunner().invoke(app, ["exec", "--json"], input='{"code": "print(1)"}')
    assert res.exit_code == 2, res.output
    reply = json.loads(res.stdout)
    assert reply["ok"] is False and reply["error"]["code"] == "SB000"
    assert "AttributeError" in reply["error"]["message"]
