"""OpenAI-compatible chat completions over HTTP for the answer eval: a streamed answer timed
token by token (TTFT apart from decode), and a one-shot call for the judge. Talks, decides
nothing; every failure is a `ChatError` the caller records against one question."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from residency.errors import ResidencyError

_DATA = "data:"
_DONE = "[DONE]"
_ERROR_BODY_CHARS = 300


class ChatError(ResidencyError):
    """One chat request failed (connection, HTTP status, malformed stream)."""


@dataclass(frozen=True, slots=True)
class StreamedAnswer:
    """A streamed completion: its text, timings, usage and response headers."""

    text: str
    finish_reason: str | None
    # Request sent → first non-empty content (or reasoning) delta. An answer whose tokens never
    # decode to text (a random-weight model's stray bytes) falls back to the first chunk with a
    # choice: vLLM sends its role chunk with the first generated token (chat_completion/serving.py).
    ttft_s: float | None
    decode_s: float | None  # first → last non-empty delta (0 with the fallback)
    prompt_tokens: int | None
    cached_tokens: int | None  # None when the server does not report prompt_tokens_details
    completion_tokens: int | None
    headers: Mapping[str, str]


def chat_url(base_url: str) -> str:
    """'{base}/v1/chat/completions' for a base URL given with or without '/v1'."""
    return base_url.rstrip("/").removesuffix("/v1") + "/v1/chat/completions"


def _http_error(url: str, response: httpx.Response, body: bytes) -> ChatError:
    """The status and the server's own message (OpenAI error shape when it has one)."""
    message = body[:_ERROR_BODY_CHARS].decode("utf-8", "replace")
    try:
        parsed = orjson.loads(body)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            message = str(parsed["error"].get("message", message))[:_ERROR_BODY_CHARS]
        elif isinstance(parsed, dict) and "message" in parsed:
            message = str(parsed["message"])[:_ERROR_BODY_CHARS]
    except orjson.JSONDecodeError:
        pass
    return ChatError(f"{url} answered HTTP {response.status_code}: {message}")


def _events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON payloads of an SSE stream's `data:` lines, up to `[DONE]`."""
    for line in lines:
        if not line.startswith(_DATA):
            continue  # blank separators, comments, `event:` lines
        data = line[len(_DATA) :].strip()
        if data == _DONE:
            return
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ChatError(f"malformed stream event: {data[:120]!r}") from None
        if not isinstance(event, dict):
            raise ChatError(f"stream event is not an object: {data[:120]!r}")
        if isinstance(event.get("error"), dict):
            raise ChatError(f"error in stream: {event['error'].get('message', event['error'])}")
        yield event


def _usage_numbers(usage: Any) -> tuple[int | None, int | None, int | None]:
    """(prompt_tokens, cached_tokens, completion_tokens) of a usage object."""
    if not isinstance(usage, dict):
        return None, None, None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return usage.get("prompt_tokens"), cached, usage.get("completion_tokens")


def stream_chat(client: httpx.Client, base_url: str, payload: dict[str, Any]) -> StreamedAnswer:
    """POST a streaming chat request and time it: TTFT at the first generated delta."""
    url = chat_url(base_url)
    body = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    parts: list[str] = []
    first: float | None = None
    last: float | None = None
    first_chunk: float | None = None
    finish: str | None = None
    usage: Any = None
    started = time.perf_counter()
    try:
        with client.stream(
            "POST", url, content=orjson.dumps(body), headers={"Content-Type": "application/json"}
        ) as response:
            if response.status_code != 200:
                raise _http_error(url, response, response.read())
            for event in _events(response.iter_lines()):
                now = time.perf_counter()
                usage = event.get("usage") or usage
                for choice in event.get("choices") or ():
                    first_chunk = now if first_chunk is None else first_chunk
                    delta = choice.get("delta") or {}
                    content = delta.get("content") or ""
                    thinking = delta.get("reasoning_content") or delta.get("reasoning") or ""
                    if content or thinking:
                        first = now if first is None else first
                        last = now
                    parts.append(content)
                    finish = choice.get("finish_reason") or finish
            headers = dict(response.headers)
    except httpx.HTTPError as exc:
        raise ChatError(f"{url}: {type(exc).__name__}: {exc}") from None
    prompt, cached, completion = _usage_numbers(usage)
    if first is None:
        first = last = first_chunk
    return StreamedAnswer(
        text="".join(parts),
        finish_reason=finish,
        ttft_s=None if first is None else first - started,
        decode_s=None if first is None or last is None else last - first,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        headers=headers,
    )


@dataclass(frozen=True, slots=True)
class Completion:
    """A one-shot completion's first choice."""

    text: str | None
    finish_reason: str | None


def complete_chat(client: httpx.Client, base_url: str, payload: dict[str, Any]) -> Completion:
    """POST a non-streaming chat request; the first choice's content and finish reason."""
    url = chat_url(base_url)
    try:
        response = client.post(
            url,
            content=orjson.dumps({**payload, "stream": False}),
            headers={"Content-Type": "application/json"},
        )
    except httpx.HTTPError as exc:
        raise ChatError(f"{url}: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise _http_error(url, response, response.content)
    try:
        body = orjson.loads(response.content)
        choice = body["choices"][0]
        message = choice.get("message") or {}
        content = message.get("content")
        return Completion(
            text=content if isinstance(content, str) else None,
            finish_reason=choice.get("finish_reason"),
        )
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        raise ChatError(f"{url}: not a chat completion: {response.text[:120]!r}") from None
