"""The MCP body limit's reading (mcp/body_limit.py): a body whose last message crosses the limit
has nothing left to drain, so its 413 goes at once (review 46 F5: the drain waited for more that
never came, until its 15 s bound)."""

from __future__ import annotations

import asyncio

from execbox.mcp.body_limit import drain, read_bounded


def _client(*messages: dict) -> object:
    queue = list(messages)

    async def receive() -> dict:
        if queue:
            return queue.pop(0)
        await asyncio.sleep(3600)  # a client that sent everything and waits for the answer
        raise AssertionError("unreachable")
    return receive


def test_a_body_that_ends_past_the_limit_has_nothing_to_drain() -> None:
    async def go() -> None:
        receive = _client({"type": "http.request", "body": b"a" * 100, "more_body": True},
                          {"type": "http.request", "body": b"b" * 100, "more_body": False})
        body, read, rest = await read_bounded(receive, 150)
        assert body is None and read == 200
        await asyncio.wait_for(drain(rest, 1000), 1)  # returns at once

    asyncio.run(go())


def test_a_body_still_coming_is_drained_until_its_end() -> None:
    async def go() -> None:
        receive = _client({"type": "http.request", "body": b"a" * 200, "more_body": True},
                          {"type": "http.request", "body": b"b" * 100, "more_body": True},
                          {"type": "http.request", "body": b"", "more_body": False})
        body, read, rest = await read_bounded(receive, 150)
        assert body is None and read == 200
        await asyncio.wait_for(drain(rest, 1000), 1)

    asyncio.run(go())


def test_a_body_within_the_limit_is_replayed_whole() -> None:
    async def go() -> None:
        receive = _client({"type": "http.request", "body": b"{}", "more_body": False})
        body, read, replay = await read_bounded(receive, 150)
        assert body == b"{}" and read == 2
        assert await replay() == {"type": "http.request", "body": b"{}", "more_body": False}

    asyncio.run(go())
