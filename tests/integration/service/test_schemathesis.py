"""Property-based API test: schemathesis drives the app's own /openapi.json against the live service.

Checks: no 5xx, documented status codes and content types, responses valid against the schema.
Bounded (a few examples per operation and mode, derandomized) so it stays a short test.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

from .conftest import Service, start_service

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = 10
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
OURS = ("/v1/sandbox/", "/healthz", "/readyz", "/metrics")


@pytest.fixture(scope="module")
def fuzzed(jail_provider) -> Iterator[Service]:
    from execbox.service.config import ServiceSettings

    svc = start_service(jail_provider, ServiceSettings(
        max_sessions=1000, tenant_max_sessions=1000, tenant_max_executions=100, idle_timeout=5,
        reap_interval=1, max_code_bytes=64 * 1024, max_file_bytes=256 * 1024))
    yield svc
    svc.stop()


def _operations(svc: Service):
    spec = httpx.get(f"{svc.url}/openapi.json").json()
    schema = schemathesis.openapi.from_dict(spec)
    for result in schema.get_all_operations():
        op = result.ok()
        if op.path.startswith(OURS):
            yield op


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_api_conforms_to_its_openapi_schema(fuzzed: Service, mode: GenerationMode) -> None:
    headers = {"Authorization": f"Bearer {fuzzed.admin}"}
    ran = []
    for op in _operations(fuzzed):

        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(generation_mode=mode))
        def check(case) -> None:  # noqa: ANN001
            case.call_and_validate(base_url=fuzzed.url, headers=headers, checks=CHECKS, timeout=120)

        try:
            check()
        except Unsatisfiable:  # nothing invalid to send (e.g. GET /healthz has no inputs)
            assert mode is GenerationMode.NEGATIVE
            continue
        ran.append(op.path)
    assert "/v1/sandbox/execute" in ran and "/v1/sandbox/sessions/{tenant_id}/{session_id}/copy" in ran
