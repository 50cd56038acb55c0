"""JSON, base64 and signals from their C modules, without the wrappers' start-up cost.

``json``, ``base64`` and ``signal`` are thin Python layers over ``_json``, ``binascii`` and
``_signal``, but importing them pulls in ``re`` and ``enum``: about 6 ms of CPU on every box
start, a sixth of what a one-shot costs end to end. The agent needs only the C halves, so it
takes them here, with the same results and error types as the wrappers (tests/unit compares
them). Any runtime whose C modules differ (another implementation, a future CPython) gets
the wrappers themselves. A box that serves many runs imports the wrappers at start all the same,
for its runs' forks to share (``main.USER_IMPORTS``); a one-shot's box (``--oneshot``) does not,
and its run imports what it uses.
Stdlib only.
"""

from __future__ import annotations

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any

try:
    import _signal as signal  # same functions and SIG* numbers; plain ints, not enum members
except ImportError:  # pragma: no cover - every CPython has it
    import signal  # type: ignore[no-redef]  # noqa: F401 - re-exported


def _not_serializable(o: Any) -> Any:
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


def _wrappers() -> tuple[Any, Any, Any, Any, Any]:
    import base64
    import json

    def dumps(obj: Any, ensure_ascii: bool = True, allow_nan: bool = True, default: Any = None) -> str:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=allow_nan,
                          default=default)

    def b64decode(data: str | bytes) -> bytes:
        return base64.b64decode(data, validate=True)

    return dumps, json.loads, json.JSONDecoder().raw_decode, base64.b64encode, b64decode


try:
    import _json
    import binascii

    class _DecoderSettings:  # what _json.make_scanner reads off a JSONDecoder
        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__

    _scan = _json.make_scanner(_DecoderSettings())
    _json.make_encoder  # noqa: B018 - its absence sends us to the wrappers
    binascii.a2b_base64(b"", strict_mode=True)  # 3.11+: what base64's validate=True checks

    def dumps(obj: Any, ensure_ascii: bool = True, allow_nan: bool = True, default: Any = None) -> str:
        """``json.dumps(obj, separators=(",", ":"), ...)``."""
        if isinstance(obj, str):
            return (_json.encode_basestring_ascii if ensure_ascii else _json.encode_basestring)(obj)
        # A fresh encoder each time, as json.dumps makes: one that fails keeps its circular-check
        # markers (and the objects in them) for good.
        encode = _json.make_encoder({}, default or _not_serializable, _json.encode_basestring_ascii if ensure_ascii
                                    else _json.encode_basestring, None, ":", ",", False, False, allow_nan)
        return "".join(encode(obj, 0))

    def raw_decode(s: str, idx: int = 0) -> tuple[Any, int]:
        """``json.JSONDecoder().raw_decode``: one value at ``idx``, and where it ends."""
        try:
            return _scan(s, idx)
        except StopIteration as e:
            from json import JSONDecodeError  # the error path only

            raise JSONDecodeError("Expecting value", s, e.value) from None

    def loads(s: str | bytes | bytearray) -> Any:
        """``json.loads`` of one document (bytes are UTF-8)."""
        if not isinstance(s, str):
            s = s.decode("utf-8", "surrogatepass")  # as json.loads decodes UTF-8
        start = 0
        while start < len(s) and s[start] in " \t\n\r":  # no copy of a frame that may be large
            start += 1
        obj, end = raw_decode(s, start)
        if end < len(s) and s[end:].strip(" \t\n\r"):
            from json import JSONDecodeError

            raise JSONDecodeError("Extra data", s, end)
        return obj

    def b64encode(data: bytes) -> bytes:
        return binascii.b2a_base64(data, newline=False)

    def b64decode(data: str | bytes) -> bytes:
        """``base64.b64decode(data, validate=True)``: ``binascii.Error`` (a ValueError) when bad."""
        if isinstance(data, str):
            data = data.encode("ascii")  # non-ASCII: UnicodeEncodeError, a ValueError as in base64
        return binascii.a2b_base64(data, strict_mode=True)

except (ImportError, AttributeError, TypeError):  # pragma: no cover - not this CPython's C modules
    dumps, loads, raw_decode, b64encode, b64decode = _wrappers()


class _Libc:
    """libc functions called with int, bytes or None arguments and an int result, errno kept.

    ``ctypes`` costs ~2 ms of every box start, most of it defining types the agent never uses;
    prctl() at start is all it needs. ``_ctypes`` (the C half) does it for ~0.7 ms. Any runtime
    where that fails gets ``ctypes.CDLL`` itself.
    """

    def __init__(self) -> None:
        self._fns: dict[str, Any] = {}
        try:
            import _ctypes

            class _Int(_ctypes._SimpleCData):
                _type_ = "i"

            class _Fn(_ctypes.CFuncPtr):
                _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
                _restype_ = _Int

            class _Self:  # what CFuncPtr((name, dll)) reads off a CDLL
                _handle = _ctypes.dlopen(None, 0)

            self._make = lambda name: _Fn((name, _Self()))
            self.get_errno = _ctypes.get_errno
        except (ImportError, AttributeError, TypeError, OSError):  # pragma: no cover - not CPython
            import ctypes

            dll = ctypes.CDLL(None, use_errno=True)
            self._make = lambda name: getattr(dll, name)
            self.get_errno = ctypes.get_errno

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        fn = self._fns.get(name)
        if fn is None:
            fn = self._fns[name] = self._make(name)
        return fn


_libc: _Libc | None = None


def libc() -> _Libc:
    """The process's libc (made on first use): ``libc().prctl(...)``, ``libc().get_errno()``."""
    global _libc
    if _libc is None:
        _libc = _Libc()
    return _libc
