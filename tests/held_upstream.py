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

from stand_in_http import json_response, serve

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

    async def answer(
        self, method: bytes, path: bytes, body: bytes, writer: asyncio.StreamWriter
    ) -> None:
        """One request: a chat completion held until released, or the control endpoints."""
        if path == b"/v1/chat/completions":
            stream = json.loads(body).get("stream") is True
            self.count += 1
            try:
                await self.release.wait()
            finally:
                self.count -= 1
            if stream:
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"content-length: %d\r\n\r\n" % len(EVENTS) + EVENTS
                )
            else:
                writer.write(json_response(CHAT))
        elif path == b"/held":
            writer.write(json_response(json.dumps({"held": self.count}).encode()))
        elif path == b"/release" and method == b"POST":
            self.release_all()
            writer.write(json_response(b"{}"))
        else:
            writer.write(json_response(MODELS if path == b"/v1/models" else b""))


if __name__ == "__main__":
    serve(int(sys.argv[1]), Held().answer)
