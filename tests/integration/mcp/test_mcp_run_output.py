"""What the model reads of a run through MCP (review 29, findings 10 and 12), on a real `execbox serve`:

- stdout/stderr past EXECBOX_MCP_MAX_OUTPUT (32 KiB by default) keep their head and tail with a
  note of what was cut and how to read it all (it was up to 1 MiB in one text block);
- a context cell past its timeout is said to be interrupted with its state kept (the text said
  both "killed" and "its state is kept").
"""

from __future__ import annotations

from typing import Any

import pytest

from execbox.errors import InvalidConfigError
from execbox.mcp.output_cap import DEFAULT_MAX_OUTPUT
from tests.integration.mcp.conftest import http_client, run_async
from tests.integration.service.conftest import start_service

pytestmark = pytest.mark.jail

LINES = "for i in range(20000):\n    print(f'line {i:05d} ' + 'x' * 40)\n"  # ~1 MB


def _text(result: Any) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def _call(url: str, token: str, *calls: tuple[str, dict[str, Any]]) -> list[Any]:
    async def go() -> list[Any]:
        async with http_client(url, token) as c:
            return [await c.call_tool(name, args) for name, args in calls]

    return run_async(go)


def test_long_output_reaches_the_model_as_head_and_tail_with_a_note(service) -> None:
    [result] = _call(service.url, service.tenant_a, ("run_code", {"code": LINES}))
    text = _text(result)
    assert len(text) < DEFAULT_MAX_OUTPUT + 2000, len(text)
    assert "line 00000 " in text and "line 19999 " in text and "line 10000 " not in text
    assert "characters of stdout cut here" in text and "read_file" in text
    capped = result.structured_content["output_capped"]["stdout"]
    assert capped["limit"] == DEFAULT_MAX_OUTPUT and capped["characters"] == 20000 * 52
    assert len(result.structured_content["stdout"]) < DEFAULT_MAX_OUTPUT + 2000  # code-facing copy: the same
    short = _call(service.url, service.tenant_a, ("run_code", {"code": "print('short')"}))[0]
    assert "output_capped" not in short.structured_content and "cut here" not in _text(short)


def test_the_cap_is_configurable(sci_jail, monkeypatch) -> None:
    monkeypatch.setenv("EXECBOX_MCP_MAX_OUTPUT", "2000")
    svc = start_service(sci_jail)
    try:
        [result] = _call(svc.url, svc.tenant_a, ("run_command", {"command": "seq 1 5000; seq 1 3000 >&2"}))
    finally:
        svc.stop()
    text = _text(result)
    assert len(text) < 2000 * 2 + 1500 and "\n5000\n" in text and "\n3000\n" in text
    assert set(result.structured_content["output_capped"]) == {"stdout", "stderr"}
    monkeypatch.setenv("EXECBOX_MCP_MAX_OUTPUT", "lots")
    with pytest.raises(InvalidConfigError, match="EXECBOX_MCP_MAX_OUTPUT"):
        start_service(sci_jail)


def test_a_context_cell_past_its_timeout_is_said_to_be_interrupted_not_killed(service) -> None:
    _, slow, after = _call(service.url, service.tenant_b,
                           ("run_code", {"code": "rows = [1, 2, 3]"}),
                           ("run_code", {"code": "import time\ntime.sleep(30)", "timeout": 1}),
                           ("run_code", {"code": "print(len(rows))"}))
    text = _text(slow)
    assert slow.is_error and slow.structured_content["metadata"]["error_code"] == "SB005"
    assert "interrupted" in text and "keeps its state" in text and "killed" not in text, text
    assert after.structured_content["stdout"] == "3\n"
