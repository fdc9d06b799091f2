"""The synchronous client of one vLLM OpenAI-compatible server: health, models, metrics,
tokenize (text and chat), a timed token-id prefill, streamed and one-shot chat, and the dev-mode
calls. Talks and parses; decides nothing. Every failure is an `UpstreamError` that names the
flag the address came from."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import orjson

from residency.errors import UpstreamError
from residency.vllm_client import endpoints
from residency.vllm_client.metrics import Sample, find_samples, parse_prometheus, sum_samples
from residency.vllm_client.sse import DONE_DATA, data_events
from residency.vllm_client.wire import (
    CACHE_CONFIG_METRIC,
    HITS_METRIC,
    QUERIES_METRIC,
    AnswerStream,
    Completion,
    RawAnswer,
    SendResult,
    ServedModel,
    StreamedAnswer,
    Usage,
    completion_of,
    status_error,
    streamed,
    transport_error,
)

PROBE_TIMEOUT_S = 10.0  # /health and /is_sleeping: a hung server must not stall a watch loop
READ_TIMEOUT_S = 30.0  # /v1/models, /metrics: small answers


class VllmClient:
    """One server at `base_url` (with or without '/v1'); `flag` is the option that named it,
    quoted in every error. Pass `http` to share a connection pool (it is then not closed)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        api_key: str | None = None,
        flag: str = "--server",
        http: httpx.Client | None = None,
    ) -> None:
        self.base_url = endpoints.base_url(base_url)
        self.where = f"{flag} {self.base_url}"
        self.timeout_s = timeout_s
        self._headers = endpoints.request_headers(api_key)
        self._own_http = http is None
        self._http = http if http is not None else httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        """Release the connection pool (unless it was passed in)."""
        if self._own_http:
            self._http.close()

    def __enter__(self) -> VllmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def url(self, path: str) -> str:
        """The full URL of `path` on this server."""
        return self.base_url + path

    # --- plumbing ---------------------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        payload: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        *,
        ok_only: bool = True,
    ) -> httpx.Response:
        """One request; an error status raises `RefusedError` unless `ok_only` is False."""
        content = orjson.dumps(payload) if payload is not None else None
        try:
            response = self._http.request(
                method,
                self.url(path),
                content=content,
                headers=self._headers,
                timeout=timeout_s if timeout_s is not None else self.timeout_s,
            )
        except httpx.HTTPError as exc:
            raise transport_error(self.where, path, exc) from None
        if ok_only and response.status_code != 200:
            raise status_error(self.where, path, response.status_code, response.content)
        return response

    def _json(self, path: str, response: httpx.Response) -> Any:
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise UpstreamError(f"{self.where}: {path} did not return JSON") from None

    def _read_timeout(self) -> float:
        return min(self.timeout_s, READ_TIMEOUT_S)

    @contextmanager
    def _stream(self, path: str, payload: dict[str, Any]) -> Iterator[httpx.Response]:
        """A streamed POST answered 200 (an error status is raised with the server's message)."""
        try:
            with self._http.stream(
                "POST",
                self.url(path),
                content=orjson.dumps(payload),
                headers=self._headers,
                timeout=self.timeout_s,
            ) as response:
                if response.status_code != 200:
                    raise status_error(self.where, path, response.status_code, response.read())
                yield response
        except httpx.HTTPError as exc:
            raise transport_error(self.where, path, exc) from None

    def _events(self, path: str, response: httpx.Response) -> Iterator[dict[str, Any] | None]:
        """The JSON object of each data event, None for [DONE]; an error event raises."""
        for data in data_events(response.iter_bytes()):
            if data == DONE_DATA:
                yield None
                continue
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                raise UpstreamError(
                    f"{self.where}: {path} streamed an event that is not JSON: {data[:120]!r}"
                ) from None
            if not isinstance(event, dict):
                raise UpstreamError(f"{self.where}: {path} streamed a non-object: {data[:120]!r}")
            if isinstance(event.get("error"), dict):
                message = event["error"].get("message", event["error"])
                raise UpstreamError(f"{self.where}: {path}: error in stream: {message}")
            yield event

    # --- server state -----------------------------------------------------------------------

    def health_status(self) -> int | None:
        """The status `/health` answers (None: no answer); a probe waits at most 10 s."""
        timeout_s = min(self.timeout_s, PROBE_TIMEOUT_S)
        try:
            return self._http.get(self.url(endpoints.HEALTH), timeout=timeout_s).status_code
        except httpx.HTTPError:
            return None

    def health(self) -> bool:
        """True when `/health` answers 200."""
        return self.health_status() == 200

    def models(self) -> list[ServedModel]:
        """The served models (`/v1/models`)."""
        path = endpoints.MODELS
        body = self._json(path, self._send("GET", path, timeout_s=self._read_timeout()))
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or not data:
            raise UpstreamError(f"{self.where}: {path} lists no model")
        return [ServedModel.model_validate(item) for item in data]

    def metrics(self) -> list[Sample]:
        """All samples of `/metrics`."""
        response = self._send("GET", endpoints.METRICS, timeout_s=self._read_timeout())
        try:
            return parse_prometheus(response.text)
        except ValueError as exc:
            raise UpstreamError(
                f"{self.where}: {endpoints.METRICS} is not Prometheus text ({exc}); "
                "is this a vLLM server?"
            ) from None

    def cache_config_info(self) -> dict[str, str]:
        """Labels of `vllm:cache_config_info`: block_size, num_gpu_blocks, ..."""
        found = find_samples(self.metrics(), CACHE_CONFIG_METRIC)
        if not found:
            raise UpstreamError(
                f"{self.where}: {endpoints.METRICS} has no {CACHE_CONFIG_METRIC}; "
                "is this a vLLM server with metrics enabled?"
            )
        return found[0].labels

    def kv_cache_tokens(self) -> int | None:
        """The server's KV-cache tokens: `kv_cache_size_tokens`, else num_gpu_blocks x
        block_size (None when its labels give neither)."""
        labels = self.cache_config_info()
        direct = label_int(labels, "kv_cache_size_tokens")
        blocks, block = label_int(labels, "num_gpu_blocks"), label_int(labels, "block_size")
        return direct or (blocks * block if blocks and block else None)

    def is_sleeping(self) -> bool | None:
        """`/is_sleeping` (dev mode only); None when the server does not offer it."""
        timeout_s = min(self.timeout_s, PROBE_TIMEOUT_S)
        try:
            response = self._http.get(self.url(endpoints.IS_SLEEPING), timeout=timeout_s)
            return bool(response.json()["is_sleeping"]) if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def reset_prefix_cache(self) -> bool:
        """`/reset_prefix_cache` (dev mode only): True when vLLM emptied the cache (it refuses
        while blocks are in use)."""
        path = endpoints.RESET_PREFIX_CACHE
        response = self._send("POST", path)
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            return True  # older servers answer an empty 200
        return bool(body.get("success", True)) if isinstance(body, dict) else True

    # --- tokens -----------------------------------------------------------------------------

    def _tokens(self, payload: dict[str, Any]) -> list[int]:
        path = endpoints.TOKENIZE
        body = self._json(path, self._send("POST", path, payload))
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list):
            raise UpstreamError(f"{self.where}: {path} returned no tokens")
        return [int(t) for t in tokens]

    def tokenize(self, prompt: str, *, model: str | None = None) -> list[int]:
        """Token ids of `prompt` with the server's tokenizer (`/tokenize`, no special tokens)."""
        payload: dict[str, Any] = {"prompt": prompt, "add_special_tokens": False}
        if model:
            payload["model"] = model
        return self._tokens(payload)

    def tokenize_chat(self, model: str, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of the chat-template rendering of `messages` (`/tokenize`)."""
        return self._tokens({"model": model, "messages": messages})

    # --- generation -------------------------------------------------------------------------

    def prefill(self, model: str, prompt_ids: Sequence[int]) -> SendResult:
        """Prefill `prompt_ids` (streamed, max_tokens=1): TTFT, cached tokens, and the
        prefix-cache metric deltas around the request."""
        before = self.metrics()
        payload = streamed(
            {"model": model, "prompt": list(prompt_ids), "max_tokens": 1, "temperature": 0}
        )
        usage: Any = None
        ttft_s: float | None = None
        started = time.perf_counter()
        path = endpoints.COMPLETIONS
        with self._stream(path, payload) as response:
            for event in self._events(path, response):
                if ttft_s is None:
                    ttft_s = time.perf_counter() - started
                if event is not None:
                    usage = event.get("usage") or usage
        after = self.metrics()
        numbers = Usage.of(usage)
        return SendResult(
            prompt_tokens=numbers.prompt_tokens
            if numbers.prompt_tokens is not None
            else len(prompt_ids),
            cached_tokens=numbers.cached_tokens,
            metrics_hit_tokens=_delta(before, after, HITS_METRIC),
            metrics_query_tokens=_delta(before, after, QUERIES_METRIC),
            ttft_s=ttft_s if ttft_s is not None else time.perf_counter() - started,
        )

    def stream_chat(self, payload: dict[str, Any]) -> StreamedAnswer:
        """POST a streaming chat request and time it: TTFT at the first generated delta."""
        path = endpoints.CHAT
        stream = AnswerStream()
        with self._stream(path, streamed(payload)) as response:
            for event in self._events(path, response):
                stream.saw_event()
                if event is None:
                    break
                stream.add(event)
            headers = dict(response.headers)
        return stream.answer(headers)

    def complete_chat(self, payload: dict[str, Any]) -> Completion:
        """POST a non-streaming chat request; the first choice's content and finish reason."""
        path = endpoints.CHAT
        response = self._send("POST", path, {**payload, "stream": False})
        try:
            return completion_of(response.content)
        except ValueError:
            raise UpstreamError(
                f"{self.where}: {path}: not a chat completion: {response.text[:120]!r}"
            ) from None

    def chat_response(self, payload: dict[str, Any], timeout_s: float | None = None) -> RawAnswer:
        """POST a chat request and return the answer as it came, whatever its status."""
        response = self._send("POST", endpoints.CHAT, payload, timeout_s, ok_only=False)
        return RawAnswer(
            response.status_code,
            response.content,
            response.headers.get("content-type", "application/json"),
        )


def _delta(before: list[Sample], after: list[Sample], name: str) -> int | None:
    old, new = sum_samples(before, name), sum_samples(after, name)
    return None if old is None or new is None else round(new - old)


def label_int(labels: dict[str, str], name: str) -> int | None:
    """An integer label of `vllm:cache_config_info` ("None", absent or not a number: None)."""
    raw = labels.get(name)
    try:
        return int(float(raw)) if raw not in (None, "None", "") else None
    except ValueError:
        return None
