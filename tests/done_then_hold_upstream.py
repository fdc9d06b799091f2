"""A stand-in upstream whose streams send `data: [DONE]` and then hold the response open for
HOLD_S seconds before ending it: the window in which a client that has its whole answer hangs
up. Tests only (`python tests/done_then_hold_upstream.py PORT`); answers /health, /v1/models and
streamed chat completions, nothing else."""

from __future__ import annotations

import asyncio
import sys

from stand_in_http import json_response, serve

HOLD_S = 2.0
MODELS = b'{"object": "list", "data": [{"id": "hold", "object": "model"}]}'
EVENTS = (
    b'data: {"id": "c", "object": "chat.completion.chunk", "model": "hold", '
    b'"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "length"}]}\n\n'
    b"data: [DONE]\n\n"
)


async def _answer(_: bytes, path: bytes, __: bytes, writer: asyncio.StreamWriter) -> None:
    if path == b"/v1/chat/completions":
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n" % len(EVENTS) + EVENTS + b"\r\n"
        )
        await writer.drain()
        await asyncio.sleep(HOLD_S)
        writer.write(b"0\r\n\r\n")
    else:
        writer.write(json_response(MODELS if path == b"/v1/models" else b""))


if __name__ == "__main__":
    serve(int(sys.argv[1]), _answer)
