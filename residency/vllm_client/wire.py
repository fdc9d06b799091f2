"""What crosses the wire to a vLLM (or any OpenAI-compatible) server, shared by the sync and the
async client: request bodies, the parsed answers (served models, usage, a streamed answer, one
timed prefill), and the error text a server sends back."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from pydantic import BaseModel, ConfigDict, Field

from residency.errors import UpstreamError

HITS_METRIC = "vllm:prefix_cache_hits_total"
QUERIES_METRIC = "vllm:prefix_cache_queries_total"
CACHE_CONFIG_METRIC = "vllm:cache_config_info"
TTFT_METHOD = "streamed /v1/completions, max_tokens=1: seconds to the first SSE chunk"
ERROR_BODY_CHARS = 300


class ServedModel(BaseModel):
    """One entry of `/v1/models`."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    id: str = Field(description="Served model name.")
    root: str | None = Field(default=None, description="Model path or repo the server loaded.")
    max_model_len: int | None = Field(default=None, description="The server's max_model_len.")


class SendResult(BaseModel):
    """One prefill of a token-id prompt: vLLM's per-request and server-wide cache numbers."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    prompt_tokens: int = Field(ge=0, description="usage.prompt_tokens.")
    cached_tokens: int | None = Field(
        ge=0,
        description="usage.prompt_tokens_details.cached_tokens (None without "
        "--enable-prompt-tokens-details).",
    )
    metrics_hit_tokens: int | None = Field(description=f"{HITS_METRIC} delta around it.")
    metrics_query_tokens: int | None = Field(description=f"{QUERIES_METRIC} delta around it.")
    ttft_s: float = Field(ge=0, description=TTFT_METHOD + ".")

    def hit_tokens(self) -> int:
        """Cached tokens: the request's own count, else the server-wide metric delta."""
        if self.cached_tokens is not None:
            return self.cached_tokens
        return self.metrics_hit_tokens or 0


@dataclass(frozen=True, slots=True)
class Usage:
    """The numbers of a usage object (None where the server leaves one out)."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # None without --enable-prompt-tokens-details
    completion_tokens: int | None = None

    @classmethod
    def of(cls, usage: Any) -> Usage:
        """Read an OpenAI usage object (anything else: all None)."""
        if not isinstance(usage, dict):
            return cls()
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return cls(
            _int_or_none(usage.get("prompt_tokens")),
            _int_or_none(cached),
            _int_or_none(usage.get("completion_tokens")),
        )


def answer_usage(content: bytes) -> dict[str, Any] | None:
    """The usage object of a whole (not streamed) OpenAI answer's body; None if it has none."""
    try:
        answer = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    usage = answer.get("usage") if isinstance(answer, dict) else None
    return usage if isinstance(usage, dict) else None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class StreamedAnswer:
    """A streamed chat completion: its text, timings, usage and response headers."""

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
    first_event_s: float | None = None  # request sent → the first SSE data event, whatever it is


@dataclass
class AnswerStream:
    """Folds the JSON events of a streamed chat completion into a `StreamedAnswer`."""

    started: float = field(default_factory=time.perf_counter)
    parts: list[str] = field(default_factory=list)
    first_event: float | None = None
    first_chunk: float | None = None
    first: float | None = None
    last: float | None = None
    finish: str | None = None
    usage: Any = None

    def saw_event(self) -> None:
        """Any data event arrived ([DONE] included)."""
        if self.first_event is None:
            self.first_event = time.perf_counter()

    def add(self, event: dict[str, Any]) -> None:
        """One JSON event: its deltas, finish reason and usage."""
        now = time.perf_counter()
        self.usage = event.get("usage") or self.usage
        for choice in event.get("choices") or ():
            self.first_chunk = now if self.first_chunk is None else self.first_chunk
            delta = choice.get("delta") or {}
            content = delta.get("content") or ""
            thinking = delta.get("reasoning_content") or delta.get("reasoning") or ""
            if content or thinking:
                self.first = now if self.first is None else self.first
                self.last = now
            self.parts.append(content)
            self.finish = choice.get("finish_reason") or self.finish

    def answer(self, headers: Mapping[str, str]) -> StreamedAnswer:
        """The answer so far, timed from `started`."""
        first, last = self.first, self.last
        if first is None:
            first = last = self.first_chunk
        usage = Usage.of(self.usage)
        return StreamedAnswer(
            text="".join(self.parts),
            finish_reason=self.finish,
            ttft_s=None if first is None else first - self.started,
            decode_s=None if first is None or last is None else last - first,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
            headers=headers,
            first_event_s=None if self.first_event is None else self.first_event - self.started,
        )


@dataclass(frozen=True, slots=True)
class Completion:
    """A one-shot chat completion's first choice."""

    text: str | None
    finish_reason: str | None


@dataclass(frozen=True, slots=True)
class RawAnswer:
    """A server's answer as it came: status, body and content type (passed on untouched)."""

    status_code: int
    content: bytes
    content_type: str = "application/json"


class RefusedError(UpstreamError):
    """The server answered a request with an error status; `answer` holds it as it came."""

    def __init__(self, message: str, answer: RawAnswer) -> None:
        super().__init__(message)
        self.answer = answer


def streamed(payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` as a stream that ends with its usage chunk."""
    return {**payload, "stream": True, "stream_options": {"include_usage": True}}


def completion_of(body: bytes) -> Completion:
    """The first choice of a chat-completions body; ValueError when it is not one."""
    try:
        choice = orjson.loads(body)["choices"][0]
        content = (choice.get("message") or {}).get("content")
        return Completion(
            text=content if isinstance(content, str) else None,
            finish_reason=choice.get("finish_reason"),
        )
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        raise ValueError("not a chat completion") from None


def error_message(body: bytes) -> str:
    """The server's own message (OpenAI error shape when it has one), clipped."""
    message = body[:ERROR_BODY_CHARS].decode("utf-8", "replace")
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return message
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return str(parsed["error"].get("message", message))[:ERROR_BODY_CHARS]
    if isinstance(parsed, dict) and "message" in parsed:
        return str(parsed["message"])[:ERROR_BODY_CHARS]
    return message


def transport_error(where: str, path: str, exc: httpx.HTTPError) -> UpstreamError:
    """`UpstreamError` for a request that got no answer, naming the exception."""
    if isinstance(exc, httpx.ConnectError):
        return UpstreamError(
            f"{where}: cannot reach {path} ({type(exc).__name__}); is vLLM running there?"
        )
    detail = str(exc)[:ERROR_BODY_CHARS]
    return UpstreamError(
        f"{where}: {path} failed ({type(exc).__name__}{': ' + detail if detail else ''})"
    )


def status_error(where: str, path: str, status_code: int, body: bytes) -> RefusedError:
    """`RefusedError` for an answer with an error status, with the server's own message."""
    answer = RawAnswer(status_code, body)
    return RefusedError(
        f"{where}: {path} answered HTTP {status_code}: {error_message(body)}", answer
    )
