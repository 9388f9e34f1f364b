"""AWS event-stream framing (what botocore's EventStream parser reads).

frame = [total_len u32][headers_len u32][crc32(prelude) u32][headers][payload][crc32 u32]
header = [name_len u8][name][type u8 = 7 (string)][value_len u16][value]

Worked example: a PayloadPart with payload b"hi" has headers
`:message-type=event`, `:event-type=PayloadPart`, `:content-type=application/octet-stream`;
total_len = 12 (prelude) + len(headers) + 2 (payload) + 4 (message crc).
"""

from __future__ import annotations

import json
import struct
import zlib


def _headers(headers: dict[str, str]) -> bytes:
    out = b""
    for name, value in headers.items():
        n, v = name.encode(), value.encode()
        out += struct.pack("!B", len(n)) + n + struct.pack("!BH", 7, len(v)) + v
    return out


def frame(headers: dict[str, str], payload: bytes) -> bytes:
    return _frame(_headers(headers), payload)


def _frame(h: bytes, payload: bytes) -> bytes:
    total = 12 + len(h) + len(payload) + 4
    prelude = struct.pack("!II", total, len(h))
    prelude += struct.pack("!I", zlib.crc32(prelude) & 0xFFFFFFFF)
    body = prelude + h + payload
    return body + struct.pack("!I", zlib.crc32(body) & 0xFFFFFFFF)


#: a PayloadPart's headers, encoded once (every streamed token is one such frame)
_PAYLOAD_PART = _headers({":message-type": "event", ":event-type": "PayloadPart",
                          ":content-type": "application/octet-stream"})


def payload_part(data: bytes) -> bytes:
    return _frame(_PAYLOAD_PART, data)


def model_stream_error(message: str, error_code: str = "ModelStreamError") -> bytes:
    body = json.dumps({"Message": message, "ErrorCode": error_code}).encode()
    return frame({":message-type": "exception", ":exception-type": "ModelStreamError",
                  ":content-type": "application/json"}, body)
