"""The server calls `residency warm` needs beyond VllmClient: chat `/tokenize`, a streamed
token-id prefill with its TTFT and cache numbers, `/is_sleeping`, and waiting for `/health`."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import orjson
from pydantic import BaseModel, ConfigDict, Field

from residency.errors import UpstreamError
from residency.metrics import Sample, sum_samples
from residency.vllm_client import VllmClient

HITS_METRIC = "vllm:prefix_cache_hits_total"
QUERIES_METRIC = "vllm:prefix_cache_queries_total"
TTFT_METHOD = "streamed /v1/completions, max_tokens=1: seconds to the first SSE chunk"


class SendResult(BaseModel):
    """One send of the shared prefix: vLLM's per-request and server-wide cache numbers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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


class Backoff:
    """Exponential delays: first, 2x first, ... capped; `reset` starts over."""

    def __init__(self, first_s: float = 1.0, cap_s: float = 60.0) -> None:
        self.first_s, self.cap_s, self._next = first_s, cap_s, first_s

    def next(self) -> float:
        """The delay to wait now; doubles the one after."""
        delay, self._next = self._next, min(self._next * 2, self.cap_s)
        return delay

    def reset(self) -> None:
        """Back to the first delay (after a success)."""
        self._next = self.first_s


class WarmSession:
    """The server calls warm needs: VllmClient's, plus chat /tokenize and streamed completions."""

    def __init__(self, server: str, request_timeout_s: float, api_key: str | None = None) -> None:
        self.client = VllmClient(server, timeout_s=30.0, api_key=api_key)
        self.base_url = self.client.base_url
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.base_url, timeout=request_timeout_s, headers=headers
        )

    def close(self) -> None:
        """Release both connection pools."""
        self.client.close()
        self._http.close()

    def _post(self, path: str, payload: dict[str, Any]) -> httpx.Response:
        try:
            response = self._http.post(path, content=orjson.dumps(payload), headers=_JSON)
        except httpx.HTTPError as exc:
            raise UpstreamError(
                f"--server {self.base_url}: {path} failed ({type(exc).__name__})"
            ) from None
        if response.status_code != 200:
            raise UpstreamError(
                f"--server {self.base_url}: {path} answered HTTP {response.status_code}: "
                f"{_error_message(response)}"
            )
        return response

    def chat_tokens(self, model: str, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of the chat-template rendering of `messages` (`/tokenize`)."""
        response = self._post("/tokenize", {"model": model, "messages": messages})
        try:
            return [int(t) for t in orjson.loads(response.content)["tokens"]]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            raise UpstreamError(f"--server {self.base_url}: /tokenize returned no tokens") from None

    def is_sleeping(self) -> bool | None:
        """`/is_sleeping` (dev mode only); None when the server does not offer it."""
        try:
            response = self._http.get("/is_sleeping", timeout=10.0)
            return bool(response.json()["is_sleeping"]) if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def send(self, model: str, prompt_ids: Sequence[int]) -> SendResult:
        """Prefill `prompt_ids` (streamed, max_tokens=1); TTFT, cached tokens, metric deltas."""
        before = self.client.metrics()
        payload = {
            "model": model,
            "prompt": list(prompt_ids),
            "max_tokens": 1,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        usage: dict[str, Any] = {}
        ttft_s: float | None = None
        started = time.perf_counter()
        try:
            with self._http.stream(
                "POST", "/v1/completions", content=orjson.dumps(payload), headers=_JSON
            ) as response:
                if response.status_code != 200:
                    response.read()
                    raise UpstreamError(
                        f"--server {self.base_url}: /v1/completions answered HTTP "
                        f"{response.status_code}: {_error_message(response)}"
                    )
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if ttft_s is None:
                        ttft_s = time.perf_counter() - started
                    if line != "data: [DONE]":
                        usage = orjson.loads(line[6:]).get("usage") or usage
        except orjson.JSONDecodeError:
            raise UpstreamError(
                f"--server {self.base_url}: /v1/completions streamed a chunk that is not JSON"
            ) from None
        except httpx.HTTPError as exc:
            raise UpstreamError(
                f"--server {self.base_url}: /v1/completions failed ({type(exc).__name__})"
            ) from None
        after = self.client.metrics()
        details = usage.get("prompt_tokens_details") or {}
        return SendResult(
            prompt_tokens=int(usage.get("prompt_tokens", len(prompt_ids))),
            cached_tokens=details.get("cached_tokens"),
            metrics_hit_tokens=_delta(before, after, HITS_METRIC),
            metrics_query_tokens=_delta(before, after, QUERIES_METRIC),
            ttft_s=ttft_s if ttft_s is not None else time.perf_counter() - started,
        )


_JSON = {"Content-Type": "application/json"}


def _error_message(response: httpx.Response) -> str:
    try:
        return str(orjson.loads(response.content)["error"]["message"])[:300]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return response.text[:300]


def _delta(before: list[Sample], after: list[Sample], name: str) -> int | None:
    old, new = sum_samples(before, name), sum_samples(after, name)
    return None if old is None or new is None else round(new - old)


def wait_for_health(
    client: VllmClient, timeout_s: float, sleep: Callable[[float], None] = time.sleep
) -> int:
    """Poll `/health` with exponential backoff (0.5 s doubling, at most 10 s); the tries it took."""
    deadline = time.monotonic() + timeout_s
    backoff = Backoff(0.5, 10.0)
    tries = 0
    while True:
        tries += 1
        if client.health():
            return tries
        left = deadline - time.monotonic()
        if left <= 0:
            raise UpstreamError(
                f"--server {client.base_url}: /health did not answer 200 within {timeout_s:g} s "
                f"({tries} tries); is vLLM running there? (--timeout to wait longer)"
            )
        sleep(min(backoff.next(), left))
