"""The E2B sandbox URL's relay to the owning replica (e2b_compat/forward.py), against raw TCP
"owners": only the owner's host is ever reached, a caller that leaves mid-upload never leaves a
whole-looking request behind, and an answer cut short is never passed on as a whole one."""

from __future__ import annotations

import asyncio

import pytest

from execbox.service.e2b_compat import forward


def _scope(path: str, method: str = "POST", headers: list | None = None) -> dict:
    return {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
            "headers": headers or [(b"host", b"sandbox"), (b"content-type", b"application/octet-stream")]}


class Owner:
    """A raw HTTP/1.1 server: records what arrived, answers with ``reply`` (bytes) then closes."""

    def __init__(self, reply: bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") -> None:
        self.reply, self.received, self.connections = reply, b"", 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            self.received += chunk
            if self.received.endswith(b"0\r\n\r\n") or (b"\r\n\r\n" in self.received
                                                       and b"transfer-encoding" not in self.received.lower()):
                break
        if self.reply:
            writer.write(self.reply)
            await writer.drain()
        writer.close()


async def _serve(owner: Owner) -> tuple[asyncio.base_events.Server, str]:
    server = await asyncio.start_server(owner.handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def _run(coro) -> None:  # noqa: ANN001
    from concurrent.futures import ThreadPoolExecutor

    async def bounded() -> None:
        await asyncio.wait_for(coro, 20)

    with ThreadPoolExecutor(1) as ex:  # a fresh loop, whatever earlier tests left in this thread
        ex.submit(asyncio.run, bounded()).result()


@pytest.fixture(autouse=True)
def _secret(monkeypatch):
    monkeypatch.setenv("EXECBOX_INTERNAL_SECRET", "s3cret")


@pytest.mark.parametrize("path", ["*@127.0.0.1:{evil}/latest/meta-data", "@127.0.0.1:{evil}/x",
                                  "//127.0.0.1:{evil}/x", "/x/../files", "/./files"])
def test_a_request_target_never_names_another_host(path):
    async def main() -> None:
        owner, evil = Owner(), Owner()
        s1, owner_url = await _serve(owner)
        s2, evil_url = await _serve(evil)
        sent: list[dict] = []
        asked = []

        async def receive() -> dict:
            if not asked:
                asked.append(1)
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.sleep(60)  # the caller stays until the answer is done
            return {"type": "http.disconnect"}

        async def send(msg: dict) -> None:
            sent.append(msg)

        await forward.relay(owner_url, "ra", _scope(path.format(evil=evil_url.rsplit(":", 1)[1]), "GET"),
                            receive, send)  # dot segments: the URL would drop them, and the signature not match
        s1.close()
        s2.close()
        assert sent[0]["status"] == 400
        assert (owner.connections, evil.connections) == (0, 0)
    _run(main())


def test_a_caller_leaving_mid_upload_never_completes_the_owners_request():
    async def main() -> None:
        owner = Owner(reply=b"")
        server, url = await _serve(owner)
        messages = [{"type": "http.request", "body": b"x" * 40000, "more_body": True}, {"type": "http.disconnect"}]

        async def receive() -> dict:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(msg: dict) -> None:
            raise AssertionError(f"nothing is answered to a caller that left: {msg}")

        await forward.relay(url, "ra", _scope("/files?path=big.bin"), receive, send)
        await asyncio.sleep(0.2)
        server.close()
        assert b"x" * 40000 in owner.received.split(b"\r\n\r\n", 1)[1]  # what the caller sent got there
        assert not owner.received.endswith(b"0\r\n\r\n")  # no closing chunk: the owner sees a broken body
    _run(main())


def test_an_answer_cut_short_by_the_owner_is_broken_off_not_ended():
    async def main() -> None:
        owner = Owner(reply=b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"y" * 100000)
        server, url = await _serve(owner)
        sent: list[dict] = []
        done = asyncio.Event()

        async def receive() -> dict:
            if not done.is_set():
                done.set()
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.sleep(60)
            return {"type": "http.disconnect"}

        async def send(msg: dict) -> None:
            sent.append(msg)

        with pytest.raises(Exception):  # noqa: B017 - the server then drops the connection
            await forward.relay(url, "ra", _scope("/files?path=a", "GET"), receive, send)
        server.close()
        start = sent[0]
        assert start["status"] == 200 and (b"content-length", b"1000000") in start["headers"]
        assert not any(m.get("more_body") is False for m in sent[1:])  # never a clean end
    _run(main())
