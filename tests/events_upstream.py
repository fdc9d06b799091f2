"""A stand-in upstream that publishes KV events from elsewhere: ``python tests/events_upstream.py
HTTP_PORT PUB_PORT`` lists a ZMQ publisher at PUB_PORT (the test's or benchmark's own, no replay
endpoint) at /kv_event_sources, as vLLM does with --kv-events-config, so that the test decides
what the router's subscriber reads. It answers /health, /v1/models, /tokenize (a message's
tokens: its text's bytes, at most 256 per message) and chat completions at once; completions
(the router's re-warms) are counted, and held while `POST /hold` is in force (`POST /release`).
`GET /count` says {"completions": n, "held": n}."""

from __future__ import annotations

import asyncio
import json
import sys

from stand_in_http import json_response, serve

MODELS = b'{"object": "list", "data": [{"id": "events", "object": "model"}]}'
ANSWER = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "model": "events",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
    }
).encode()


class State:
    def __init__(self, sources: bytes) -> None:
        self.sources = sources
        self.completions = 0
        self.held = 0
        self.open = asyncio.Event()
        self.open.set()


def _tokens(body: bytes) -> bytes:
    request = json.loads(body)
    tokens: list[int] = []
    for message in request.get("messages") or [{"content": request.get("prompt", "")}]:
        tokens += list(str(message.get("content") or "").encode()[:256])
    return json.dumps({"tokens": tokens, "count": len(tokens), "max_model_len": 8192}).encode()


async def _answer(state: State, path: bytes, body: bytes) -> bytes:
    if path == b"/kv_event_sources":
        return state.sources
    if path == b"/tokenize":
        return _tokens(body)
    if path == b"/v1/completions":
        state.completions += 1
        state.held += 1
        try:
            await state.open.wait()
        finally:
            state.held -= 1
        return ANSWER
    if path == b"/v1/chat/completions":
        return ANSWER
    if path == b"/count":
        return json.dumps({"completions": state.completions, "held": state.held}).encode()
    if path == b"/hold":
        state.open.clear()
    elif path == b"/release":
        state.open.set()
    return MODELS if path == b"/v1/models" else b"{}"


def main(port: int, pub_port: int) -> None:
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{pub_port}",
    }
    state = State(json.dumps({"0": config}).encode())

    async def answer(_: bytes, path: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(json_response(await _answer(state, path, body)))

    serve(port, answer)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
