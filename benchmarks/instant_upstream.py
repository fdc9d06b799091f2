"""An HTTP/1.1 keep-alive server that answers vLLM's /health, /v1/models and chat completions
at once, with a fixed body: what is left of a request's time is the client's own.

Benchmarks only (`python benchmarks/instant_upstream.py PORT`): it parses each request body as
JSON, as vLLM would, and answers nothing else.
"""

from __future__ import annotations

import asyncio
import sys

import orjson
import uvloop

MODELS = orjson.dumps({"object": "list", "data": [{"id": "instant", "object": "model"}]})
CHAT = orjson.dumps(
    {
        "id": "chatcmpl-instant",
        "object": "chat.completion",
        "model": "instant",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "a"},
                "finish_reason": "length",
            }
        ],
        "usage": {
            "prompt_tokens": 29_300,
            "completion_tokens": 1,
            "total_tokens": 29_301,
            "prompt_tokens_details": {"cached_tokens": 29_200},
        },
    }
)


def _response(body: bytes, status: bytes = b"200 OK") -> bytes:
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return head % (status, len(body)) + body


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            path = lines[0].split(b" ")[1]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await reader.readexactly(length) if length else b""
            if path == b"/health":
                writer.write(_response(b""))
            elif path == b"/v1/models":
                writer.write(_response(MODELS))
            elif path == b"/v1/chat/completions":
                orjson.loads(body)
                writer.write(_response(CHAT))
            else:
                writer.write(_response(b'{"error": "not found"}', b"404 Not Found"))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1])))
