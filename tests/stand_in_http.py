"""The HTTP/1.1 the stand-in upstreams speak (tests/*_upstream.py, each run as a script from
tests/, so this module is on its path): one request read off a kept-alive connection, one JSON
answer with its length."""

from __future__ import annotations

import asyncio


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes, bytes]:
    """(method, path, body) of the next request on the connection; its body read whole by its
    Content-Length. Raises asyncio.IncompleteReadError when the client has closed."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    method, path = lines[0].split(b" ")[:2]
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    body = await reader.readexactly(length) if length else b""
    return method, path, body


def json_response(body: bytes, status: bytes = b"200 OK") -> bytes:
    """A whole response: `status`, a JSON content type, the length, `body`."""
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return head % (status, len(body)) + body
