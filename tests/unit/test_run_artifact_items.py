"""/run's inline artifacts (executor_results.artifact_items, review 42 finding 2): at most the cap in
total, in the run's order; an artifact over what is left of it is never read (nor fetched from the
box) and is named with its size, the cap and the setting; the default is 10 MiB."""

from __future__ import annotations

import hashlib

from execbox.models import Artifact, ExecutionResult
from execbox.service.routes import executor_results
from execbox.service.routes.executor_results import artifact_items, result_to_response

MIB = 1024 * 1024


def _artifact(name: str, size: int, fetched: list[str]) -> Artifact:
    data = b"x" * size

    def fetch(path: str) -> bytes:
        fetched.append(path)
        return data

    return Artifact(name, "application/octet-stream", size, hashlib.sha256(data).hexdigest(), name, _fetcher=fetch)


def test_an_artifact_over_the_cap_is_never_fetched_and_is_named() -> None:
    fetched: list[str] = []
    result = ExecutionResult("", "", 0, 0.1, artifacts=[
        _artifact("a", 600, fetched), _artifact("b", 600, fetched), _artifact("c", 300, fetched)])
    items, problems = artifact_items(result, 1000)
    assert [i["name"] for i in items] == ["a", "c"]
    assert fetched == ["a", "c"]  # b was left out without being read
    assert problems == ["b: skipped (600 bytes), artifacts returned inline are at most 1000 bytes in total "
                        "(EXECBOX_EXECUTOR_MAX_ARTIFACT_BYTES)"]
    body = result_to_response(result, items, problems)
    assert body["status"] == "success" and body["detail"] == "artifacts not returned: " + problems[0]


def test_the_default_is_ten_mib(monkeypatch) -> None:
    monkeypatch.delenv("EXECBOX_EXECUTOR_MAX_ARTIFACT_BYTES", raising=False)
    assert executor_results.max_artifact_bytes_from_env() == 10 * MIB
    fetched: list[str] = []
    result = ExecutionResult("", "", 0, 0.1, artifacts=[_artifact("big", 10 * MIB + 1, fetched)])
    items, problems = artifact_items(result)
    assert items == [] and fetched == [] and "10485760 bytes in total" in problems[0]
