"""A stand-in upstream that holds every chat completion until told to answer: tests prove what
requests in flight do to the router (its concurrency budget) by events, not by timing.

`python tests/held_upstream.py PORT`. Answers /health and /v1/models at once; a POST to
/v1/chat/completions is counted and held; `GET /held` says how many are held now and
`POST /release` answers them all (a one-choice completion, or its stream when asked).
"""

from __future__ import annotations

import asyncio
import json
import sys

from stand_in_http import json_response, read_request

MODELS = b'{"object": "list", "data": [{"id": "held", "object": "model"}]}'
CHAT = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "model": "held",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
    }
).encode()
EVENTS = (
    b'data: {"id": "c", "object": "chat.completion.chunk", "model": "held", '
    b'"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


class Held:
    """The chat completions waiting for a release."""

    def __init__(self) -> None:
        self.count = 0
        self.release = asyncio.Event()

    def release_all(self) -> None:
        self.release.set()
        self.release = asyncio.Event()


async def _serve(held: Held, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            method, path, body = await read_request(reader)
            if path == b"/v1/chat/completions":
                stream = json.loads(body).get("stream") is True
                held.count += 1
                try:
                    await held.release.wait()
                finally:
                    held.count -= 1
                if stream:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                        b"content-length: %d\r\n\r\n" % len(EVENTS) + EVENTS
                    )
                else:
                    writer.write(json_response(CHAT))
            elif path == b"/held":
                writer.write(json_response(json.dumps({"held": held.count}).encode()))
            elif path == b"/release" and method == b"POST":
                held.release_all()
                writer.write(json_response(b"{}"))
            else:
                writer.write(json_response(MODELS if path == b"/v1/models" else b""))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()


async def main(port: int) -> None:
    held = Held()
    server = await asyncio.start_server(lambda r, w: _serve(held, r, w), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
