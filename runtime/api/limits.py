"""Limits that hold for every request body, however it is sent: an ASGI middleware in front of the app.

The body is counted while it is read, so a chunked or streamed body without a Content-Length is cut off at
``max_bytes`` (413) just like one that declares its size; nothing past the limit is buffered. Headers are
bounded in count and size (431), and a JSON body nested deeper than ``max_json_depth`` is a 400 before any
parser recurses into it. Errors have OpenAI's shape. After the body, ``receive`` is the server's again, so
the app still sees the client disconnect.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate

from radixlm.runtime.api.errors import ApiError

MAX_HEADERS = 100
MAX_HEADER_BYTES = 32 * 1024
MAX_JSON_DEPTH = 100
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")


def json_depth(body: bytes) -> int:
    """How deep the brackets of a JSON text nest (strings skipped): a C-speed scan, no recursion."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKET)
    return max(accumulate(1 if c in b"[{" else -1 for c in brackets), default=0)


class BodyLimits:
    def __init__(self, app, max_bytes: int, max_json_depth: int = MAX_JSON_DEPTH) -> None:
        self.app, self.max_bytes, self.max_depth = app, max_bytes, max_json_depth

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = scope.get("headers") or []
        if len(headers) > MAX_HEADERS or sum(len(k) + len(v) for k, v in headers) > MAX_HEADER_BYTES:
            return await self._reject(send, 431, f"at most {MAX_HEADERS} headers and {MAX_HEADER_BYTES} bytes of them")
        declared = dict(headers).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:  # too big by its own account: not even read
            return await self._reject(send, 413, f"request body over {self.max_bytes} bytes")
        body, more, first = bytearray(), True, None
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away while sending
                first = message
                break
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                return await self._reject(send, 413, f"request body over {self.max_bytes} bytes")
        if bytes(body[:64]).lstrip()[:1] in (b"{", b"[") and json_depth(bytes(body)) > self.max_depth:
            return await self._reject(send, 400, f"the JSON body nests deeper than {self.max_depth} levels")
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return first or {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _reject(send, status: int, message: str) -> None:
        payload = json.dumps(ApiError(status, message).body()).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})
