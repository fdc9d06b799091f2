"""Server-sent events as vLLM streams them, the one parser for every reader: split a byte stream
into whole events, read an event's data, its JSON and its usage chunk. The router passes events
through byte for byte; the sync readers (warm, eval, demo) decode them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"
DONE_DATA = b"[DONE]"


class EventSplitter:
    """Reassembles SSE events ('...\\n\\n'-terminated) from arbitrary network chunks."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Whole events completed by `data` (each ending in a blank line)."""
        self._buffer += data
        events: list[bytes] = []
        while True:
            cut = self._buffer.find(b"\n\n")
            if cut < 0:
                return events
            events.append(self._buffer[: cut + 2])
            self._buffer = self._buffer[cut + 2 :]

    def rest(self) -> bytes:
        """Bytes after the last whole event (a stream cut mid-event leaves some)."""
        return self._buffer


def event_data(event: bytes) -> bytes | None:
    """The data of one event (its 'data:' lines joined by newlines); None when it has none
    (a comment or another field only)."""
    lines = [
        line[5:].removeprefix(b" ")
        for line in event.strip(b"\n").split(b"\n")
        if line.startswith(b"data:")
    ]
    return b"\n".join(lines) if lines else None


def data_events(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The data of every event of a byte stream, in order ([DONE] included)."""
    splitter = EventSplitter()
    for chunk in chunks:
        for event in splitter.feed(chunk):
            data = event_data(event)
            if data is not None:
                yield data
    tail = splitter.rest().strip()
    if tail and (data := event_data(tail)) is not None:  # a last event without its blank line
        yield data


def event_json(event: bytes) -> dict[str, Any] | None:
    """The JSON object of a 'data: {...}' event, None for [DONE], comments or non-JSON."""
    payload = event_data(event)
    if payload is None or not payload.strip().startswith(b"{"):
        return None
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def usage_of(event: bytes) -> tuple[dict[str, Any] | None, bool]:
    """(usage, usage_only): the event's usage object, and whether it carries nothing else.

    vLLM's `stream_options.include_usage` adds one last chunk with `choices: []` and the usage;
    the router asks for it on every stream and drops it again when the client did not.
    """
    if b'"usage"' not in event:
        return None, False
    obj = event_json(event)
    if obj is None or not isinstance(obj.get("usage"), dict):
        return None, False
    return obj["usage"], not obj.get("choices")


def error_event(message: str, code: int = 502, kind: str = "server_error") -> bytes:
    """An OpenAI-shaped error as one SSE event (what vLLM itself sends on a failed stream)."""
    body = {"error": {"message": message, "type": kind, "code": code}}
    return b"data: " + orjson.dumps(body) + b"\n\n"
