"""Host side of the agent protocol: send a request, collect its events, return its reply.

Transport-agnostic: a ``Transport`` moves bytes (subprocess pipes for local/jail boxes, an
attached container socket for Docker). One ordinary request at a time per box, plus any number
of background-process and file requests beside it; ``cancel`` may be called from another thread while a
request runs.
"""

from __future__ import annotations

import itertools
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..agent import protocol, pump
from ..errors import (
    InstanceCreationError,
    InvalidConfigError,
    ProviderUnavailableError,
    SandboxError,
    error_from_dict,
)

EventCallback = Callable[[str, Any], None]
READ_CHUNK = 64 * 1024
"""Bytes asked for per read of a box's stream. Below malloc's mmap threshold (128 KiB): a 1 MiB
read buffer was an mmap, an mremap to the frame's size and an munmap on every reply (~10 % of the
service's CPU per session run); large outputs simply take more reads."""

MiB = 1024 * 1024
MAX_REPLY_FRAME = 96 * MiB
"""The largest frame the host accepts from a box (the agent's own bound, ``protocol.MAX_FRAME``, is
512 MiB). A box is not trusted and every byte of a frame is buffered in the service's (the shared
kubernetes gateway's) memory before it is decoded, so the host allows only what a legitimate reply
can reach. Derived from the agent's limits:

* ``files.read_bytes``: a file of at most ``fileops.MAX_READ_BYTES`` (64 MiB; the host never asks
  for more), base64 in the reply: 4/3 of it, 85.4 MiB, plus ~100 bytes of JSON. The largest reply.
* ``files.read``: a page of a text file of at most 64 MiB; JSON escaping (of newlines, quotes) of real
  text stays well within the 1.5x left.
* ``exec`` at the default output cap (``pump.DEFAULT_OUTPUT_CAP``, 1 MiB): stdout, stderr and the
  result at most 1 MiB each, at most 6 MiB each once JSON-escaped (a control character is
  six bytes), plus inline artifacts of at most ``pump.INLINE_ARTIFACT_CAP`` (16 MiB, 21.4 MiB as
  base64): under 40 MiB. An exec asking a larger ``output_cap`` (``max_output_bytes`` goes up to
  64 MiB) raises the limit while it is outstanding: ``reply_frame_limit``.
* ``proc.poll`` (256 KiB of each stream), listings (``fileops.MAX_WALK_ENTRIES`` entries of ~100
  bytes): far below.

Rounded up to 96 MiB. A larger announced length is refused as soon as its 4-byte header is read,
nothing of its body buffered, and the box is treated as broken (SB009, ``BoxDied``).
tests/unit/test_agent_frame_cap.py checks this derivation against the agent's constants."""
OUTPUT_ESCAPING = 2
"""How much larger than its raw bytes an exec's captured output is allowed to be in the reply
(JSON escaping of newlines, quotes and tabs; U+FFFD for bytes that are not UTF-8)."""


def _b64_size(n: int) -> int:
    return 4 * -(-n // 3)


def reply_frame_limit(op: str, params: dict[str, Any] | None) -> int:
    """The frame limit a request's reply needs: ``MAX_REPLY_FRAME``, or more for an ``exec`` whose
    ``output_cap`` is over the default (stdout, stderr and the result up to it each, escaped, plus
    the inline artifacts)."""
    cap = (params or {}).get("output_cap")
    if op != "exec" or not isinstance(cap, int) or cap <= pump.DEFAULT_OUTPUT_CAP:
        return MAX_REPLY_FRAME
    return max(MAX_REPLY_FRAME, OUTPUT_ESCAPING * 3 * cap + _b64_size(pump.INLINE_ARTIFACT_CAP) + MiB)


_POLL_READABLE = select.POLLIN | select.POLLPRI


def wait_readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` has data (or EOF, or an error) within ``timeout`` seconds.

    poll(2), not select(2): select refuses descriptors numbered 1024 and above, which a service
    holding a few hundred boxes reaches once its open-file limit allows it (service/fd_limit.py).
    """
    poller = select.poll()  # per call: a poll object must not be polled from two threads at once
    poller.register(fd, _POLL_READABLE)
    return bool(poller.poll(max(0.0, timeout) * 1000))


class Transport(Protocol):
    def send(self, data: bytes) -> None: ...

    def recv(self, max_bytes: int, timeout: float) -> bytes:
        """Bytes available within ``timeout`` (b"" means EOF); raise TimeoutError if none."""
        ...

    def close(self) -> None: ...


class PipeTransport:
    """Transport over a pair of file descriptors (a child's stdin and stdout)."""

    def __init__(self, write_fd: int, read_fd: int, owns_fds: bool = True) -> None:
        self.write_fd = write_fd
        self.read_fd = read_fd
        self.owns_fds = owns_fds

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.write_fd, view) :]

    def recv(self, max_bytes: int, timeout: float) -> bytes:
        if not wait_readable(self.read_fd, timeout):
            raise TimeoutError
        return os.read(self.read_fd, max_bytes)

    def close(self) -> None:
        if not self.owns_fds:
            return
        for fd in (self.write_fd, self.read_fd):
            try:
                os.close(fd)
            except OSError:
                pass


class BoxDied(ProviderUnavailableError):
    """The box's agent stream ended: the box crashed or was killed."""


class AgentClient:
    def __init__(self, transport: Transport, box_name: str = "box", max_frame: int = MAX_REPLY_FRAME) -> None:
        self.transport = transport
        self.box_name = box_name
        self.max_frame = max_frame
        self.frames = protocol.FrameBuffer(max_frame)
        self.wider: dict[int, int] = {}  # outstanding requests whose replies may be larger: id -> limit
        self.inbox: list[dict[str, Any]] = []
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.hello: dict[str, Any] = {}
        self.beside_run: frozenset[str] = frozenset()  # file ops this agent serves during a run (ready/ping)
        self.dead: str | None = None
        self.current: int | None = None  # the running ordinary request (what ``cancel`` stops)
        self.mail: dict[int, list[dict[str, Any]]] = {}  # replies and events by request id
        self.mail_cond = threading.Condition()
        self.reading = False  # one caller at a time reads the transport

    def _send(self, message: dict[str, Any]) -> None:
        try:
            frame = protocol.encode_frame(message)
        except UnicodeEncodeError:  # a lone UTF-16 surrogate ("\ud800" in JSON) has no UTF-8 form
            field = (protocol.not_utf8(message) or "request")[:64]
            raise InvalidConfigError(f"{field} is not valid UTF-8 text: it holds a lone UTF-16 surrogate",
                                     details={"field": field}) from None
        with self.write_lock:
            try:
                self.transport.send(frame)
            except OSError as e:
                self.dead = f"write failed: {e}"
                raise BoxDied(f"{self.box_name} is gone ({e})", details={"box": self.box_name}) from None

    def _next(self, deadline: float) -> dict[str, Any]:
        while not self.inbox:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self.inbox.extend(self._read_frames(remaining))
        return self.inbox.pop(0)

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        try:
            msg = self._next(time.monotonic() + timeout)
        except TimeoutError:
            raise InstanceCreationError(
                f"{self.box_name}: agent did not become ready within {timeout:.0f}s"
            ) from None
        except BoxDied as e:
            raise InstanceCreationError(f"{self.box_name}: agent failed to start ({e.message})") from None
        if msg.get("event") != "ready":
            raise InstanceCreationError(f"{self.box_name}: unexpected first message from agent: {msg!r:.200}")
        self.hello = msg
        self.beside_run = protocol.FILE_OPS.intersection(msg.get("beside_run") or ())
        return msg

    def call(self, op: str, params: dict[str, Any] | None = None, *, timeout: float = 60.0,
             on_event: EventCallback | None = None) -> Any:
        """Send one request and wait for its reply; raise the SB error the agent reports.

        Ordinary requests (runs, context resets) go one at a time (``lock``), as the agent serves
        them; ops in ``protocol.INLINE_OPS`` (background processes) and the file ops the agent
        said it serves beside a run (``beside_run``) are sent at once, even while a run goes on,
        and their replies are picked out of the shared stream by id. Such an op that gets no reply
        in time reports the box busy instead of dead.
        """
        if self.dead:
            raise BoxDied(f"{self.box_name} is gone ({self.dead})", details={"box": self.box_name})
        if op in protocol.INLINE_OPS or op in self.beside_run:
            return self._call(op, params, timeout, on_event)
        with self.lock:
            return self._call(op, params, timeout, on_event, track=True)

    def _call(self, op: str, params: dict[str, Any] | None, timeout: float, on_event: EventCallback | None,
              track: bool = False) -> Any:
        rid = next(self.ids)
        limit = reply_frame_limit(op, params)
        with self.mail_cond:
            self.mail[rid] = []
            if limit > self.max_frame:
                self.wider[rid] = limit
                self.frames.max_frame = max(self.frames.max_frame, limit)
        if track:
            self.current = rid
        try:
            self._send({"id": rid, "op": op, **(params or {})})
            deadline = time.monotonic() + timeout
            while True:
                try:
                    msg = self._next_for(rid, deadline)
                except TimeoutError:
                    if not track:  # the agent is busy with a long ordinary request, not gone
                        raise ProviderUnavailableError(
                            f"{self.box_name} did not answer {op} within {timeout:.0f}s (busy)",
                            details={"box": self.box_name, "op": op, "busy": True}) from None
                    self.dead = f"no reply to {op} within {timeout:.0f}s"
                    with self.mail_cond:
                        self.mail_cond.notify_all()
                    raise BoxDied(f"{self.box_name} did not answer {op} within {timeout:.0f}s",
                                  details={"box": self.box_name, "op": op}) from None
                if "event" in msg:
                    if on_event is not None:
                        on_event(msg["event"], msg.get("data"))
                    continue
                if msg.get("ok"):
                    return msg.get("value")
                raise agent_error(msg.get("error") or {})
        finally:
            if track:
                self.current = None
            with self.mail_cond:
                self.mail.pop(rid, None)
                if self.wider.pop(rid, None) is not None:
                    self.frames.max_frame = max([self.max_frame, *self.wider.values()])

    def _next_for(self, rid: int, deadline: float) -> dict[str, Any]:
        """The next message for ``rid``; one waiting caller at a time reads and sorts by id."""
        while True:
            with self.mail_cond:
                while True:
                    box = self.mail[rid]
                    if box:
                        return box.pop(0)
                    if self.dead:
                        raise BoxDied(f"{self.box_name} stopped answering: {self.dead}",
                                      details={"box": self.box_name})
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError
                    if not self.reading:
                        self.reading = True
                        break
                    self.mail_cond.wait(remaining)
            frames: list[dict[str, Any]] = []
            try:
                frames = self._read_frames(remaining)
            except TimeoutError:
                pass  # the loop above decides, with the lock held, whether time is up
            finally:
                with self.mail_cond:
                    self.reading = False
                    for msg in frames:
                        target = self.mail.get(msg.get("id"))  # type: ignore[arg-type]
                        if target is not None:
                            target.append(msg)
                    self.mail_cond.notify_all()

    def _read_frames(self, timeout: float) -> list[dict[str, Any]]:
        if self.inbox:
            frames, self.inbox = self.inbox, []
            return frames
        try:
            data = self.transport.recv(READ_CHUNK, timeout)
        except TimeoutError:  # an OSError too, but no data in time is the caller's to judge (busy, dead)
            raise
        except OSError as e:
            data = b""
            self.dead = f"read failed: {e}"
        if not data:
            self.dead = self.dead or "stream closed"
            raise BoxDied(f"{self.box_name} stopped answering: its agent exited ({self.dead})",
                          details={"box": self.box_name})
        try:
            frames = self.frames.feed(data)
        except protocol.FrameTooLarge as e:
            self.dead = f"protocol error: {e}"
            raise BoxDied(f"{self.box_name} announced a frame of {e.size} bytes, over the host's limit of {e.limit} "
                          "(larger than any legitimate reply): the box is treated as broken",
                          details={"box": self.box_name, "frame_bytes": e.size, "limit": e.limit}) from None
        except (protocol.ProtocolError, ValueError) as e:
            self.dead = f"protocol error: {e}"
            raise BoxDied(f"{self.box_name} sent a corrupt frame: {e}", details={"box": self.box_name}) from None
        for msg in frames:  # what the callers index by: an object, its id an int (or absent)
            if not isinstance(msg, dict) or not isinstance(msg.get("id"), (int, type(None))):
                self.dead = "protocol error: a frame that is not a message"
                raise BoxDied(f"{self.box_name} sent a corrupt frame: not a message object ({str(msg)[:80]})",
                              details={"box": self.box_name})
        return frames

    def cancel(self) -> bool:
        """Ask the agent to stop the running request (safe from any thread)."""
        rid = self.current
        if rid is None or self.dead:
            return False
        try:
            self._send({"op": "cancel", "target": rid})
        except BoxDied:
            return False
        return True

    def cancel_any(self) -> None:
        """Stop whatever run the agent is serving, whoever asked for it: a previous execbox
        process's, when this client re-attached to its box (that run's requester is gone, and
        the agent would serve our requests only once it ends). Dropped when nothing runs."""
        self._send({"op": "cancel", "target": "*"})

    def close(self) -> None:
        self.transport.close()


def agent_error(err: dict[str, Any]) -> SandboxError:
    """The typed SB exception for an agent error reply (errors.error_from_dict's refinements)."""
    return error_from_dict({"message": "agent error", **err}, err.get("status"))
