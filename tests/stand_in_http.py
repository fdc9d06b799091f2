"""The HTTP/1.1 the stand-in upstreams speak (tests/*_upstream.py, each run as a script from
tests/, so this module is on its path): the server loop, one request read off a kept-alive
connection, one JSON answer with its length."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

# answer(method, path, body, writer): writes one whole response (the loop drains it).
Answer = Callable[[bytes, bytes, bytes, asyncio.StreamWriter], Awaitable[None]]


def serve(port: int, answer: Answer) -> None:
    """Serve 127.0.0.1:PORT until the process is stopped: every request of every kept-alive
    connection goes to `answer`; a connection ends when its client closes it."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                method, path, body = await read_request(reader)
                await answer(method, path, body, writer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(connection, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


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
