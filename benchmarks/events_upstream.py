"""A stand-in upstream for the KV-event flood benchmark: ``python benchmarks/events_upstream.py
HTTP_PORT PUB_PORT`` answers /health and /v1/models, and lists a ZMQ publisher at PUB_PORT (the
benchmark's own, no replay endpoint) at /kv_event_sources, as vLLM does with
--kv-events-config. Anything else is answered with an empty 200."""

from __future__ import annotations

import asyncio
import json
import sys

MODELS = b'{"object": "list", "data": [{"id": "flood", "object": "model"}]}'


def _plain(body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return head % len(body) + body


async def _serve(
    sources: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
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
            if length:
                await reader.readexactly(length)
            if path == b"/kv_event_sources":
                writer.write(_plain(sources))
            else:
                writer.write(_plain(MODELS if path == b"/v1/models" else b"{}"))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()


async def main(port: int, pub_port: int) -> None:
    config = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://127.0.0.1:{pub_port}"}  # fmt: skip
    sources = json.dumps({"0": config}).encode()
    server = await asyncio.start_server(lambda r, w: _serve(sources, r, w), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
