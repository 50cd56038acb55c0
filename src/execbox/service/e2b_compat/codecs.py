"""Connect codecs that report an undecodable request as INVALID_ARGUMENT.

connectrpc's own codecs let a decode error escape as Code.UNKNOWN (HTTP 500); a malformed
message is the client's fault, so these wrap the library's proto binary and proto JSON codecs
(the protobuf runtime does all (de)serialisation) and only translate the failure.
"""

from __future__ import annotations

from typing import Any

from connectrpc.code import Code
from connectrpc.codec import Codec, proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError


class _Strict:
    def __init__(self, inner: Codec) -> None:
        self._inner = inner

    def name(self) -> str:
        return self._inner.name()

    def encode(self, message: Any) -> bytes:
        return self._inner.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type[Any]) -> Any:
        try:
            return self._inner.decode(data, message_class)
        except ConnectError:
            raise
        except Exception as e:  # noqa: BLE001 - any decode failure is a malformed request
            raise ConnectError(Code.INVALID_ARGUMENT, f"malformed {message_class.__name__}: {e}") from None


def strict_codecs() -> list[Codec]:
    return [_Strict(proto_binary_codec()), _Strict(proto_json_codec())]  # type: ignore[list-item]
