"""The asynchronous client of one vLLM server, for the router and its pruner: health, the served
model, chat tokenization, and generation requests whose bytes the router passes through.

It runs on aiohttp rather than httpx: on the router's hot path (one ~190 KB chat body to a local
vLLM per request) an aiohttp POST took half of httpx's time, 0.50 ms vs 1.05 ms at the median
on a 2-core Intel Xeon (benchmarks/test_bench_upstream_client.py measures both side by side).
Nothing of aiohttp leaks out: callers get `RawAnswer`, `UpstreamStream` and this module's
exceptions.

The hot-path calls (`tokenize_chat`, `generate`, `open_stream`) raise `TransportError` when no
whole answer came, as `UnreachedError` when nothing reached vLLM (so the router can retry on
another server) and `AnswerTimeoutError` when vLLM went quiet for longer than the read timeout;
the other calls answer False / None, or raise `UpstreamError`.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from residency.errors import UpstreamError
from residency.vllm_client import endpoints
from residency.vllm_client.wire import RawAnswer, status_error

Session = aiohttp.ClientSession  # the connection pool the async clients share (`open_session`)


class Probe(enum.Enum):
    """What one `/health` probe found."""

    UP = "up"
    SLOW = "slow"  # no answer within the probe's timeout
    DOWN = "down"


class TransportError(Exception):
    """No whole answer came back (the connection failed, closed early or timed out)."""


class UnreachedError(TransportError):
    """The request never reached the server: safe to send elsewhere."""


class AnswerTimeoutError(TransportError):
    """The server sent nothing for longer than the read timeout."""


def open_session(
    read_timeout_s: float, *, connect_timeout_s: float = 5.0, connections: int = 1024
) -> aiohttp.ClientSession:
    """A connection pool for `AsyncVllmClient`s (call inside the event loop; close it after).

    `read_timeout_s` bounds each wait for bytes, not the whole answer, so a long stream that
    keeps producing tokens is never cut. Connections are kept alive and reused (HTTP/1.1).
    """
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0, ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s)
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, skip_auto_headers=("User-Agent",)
    )


def _transport_error(exc: BaseException, path: str, where: str) -> TransportError:
    """The client's exception for an aiohttp failure on `path`."""
    name = type(exc).__name__
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        return UnreachedError(f"{where}: cannot reach {path} ({name}); is vLLM running there?")
    if isinstance(exc, asyncio.TimeoutError):  # aiohttp's read timeouts are TimeoutErrors
        return AnswerTimeoutError(f"{where}: {path} did not answer in time ({name})")
    return TransportError(f"{where}: {path} failed ({name}: {exc})")


class UpstreamStream:
    """An answer being streamed: status and content type now, the body as it arrives."""

    def __init__(self, response: aiohttp.ClientResponse, path: str, where: str) -> None:
        self._response = response
        self._path = path
        self._where = where
        self.status_code = response.status
        self.content_type = response.headers.get("Content-Type", "application/json")

    async def read(self) -> bytes:
        """The whole remaining body (for an error status)."""
        try:
            return await self._response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _transport_error(exc, self._path, self._where) from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive, in whatever pieces the network delivers."""
        try:
            async for data in self._response.content.iter_any():
                yield data
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _transport_error(exc, self._path, self._where) from exc

    def close(self) -> None:
        """Done with it: a fully read answer returns its connection to the pool; one cut short
        closes it, which makes vLLM abort the request."""
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


class AsyncVllmClient:
    """One server at `base_url`, over a shared session (the caller's pool: `open_session`)."""

    def __init__(
        self,
        base_url: str,
        session: aiohttp.ClientSession,
        *,
        api_key: str | None = None,
        flag: str = "--upstream",
    ) -> None:
        self.base_url = endpoints.base_url(base_url)
        self.where = f"{flag} {self.base_url}"
        self._session = session
        self._headers = endpoints.request_headers(api_key)
        self._generation_urls = {g: self.url(p) for g, p in endpoints.GENERATION_PATHS.items()}

    def url(self, path: str) -> str:
        """The full URL of `path` on this server."""
        return self.base_url + path

    async def probe(self, timeout_s: float = 5.0) -> Probe:
        """`/health` once: `UP` on 200, `SLOW` when no answer came within `timeout_s` (a busy
        server on a loaded host answers late), `DOWN` when refused, reset or not 200."""
        try:
            async with self._session.get(
                self.url(endpoints.HEALTH), headers=self._headers, timeout=_total(timeout_s)
            ) as response:
                return Probe.UP if response.status == 200 else Probe.DOWN
        except TimeoutError:
            return Probe.SLOW
        except aiohttp.ClientError:
            return Probe.DOWN

    async def models_answer(self, timeout_s: float = 10.0) -> RawAnswer:
        """`/v1/models` as it came; no answer raises `TransportError` (the caller marks the
        server down)."""
        return await self._post_or_get("GET", endpoints.MODELS, None, _total(timeout_s))

    async def first_model(self, timeout_s: float = 10.0) -> str | None:
        """The first served model's id, or None when `/v1/models` cannot say."""
        try:
            answer = await self.models_answer(timeout_s)
            return str(orjson.loads(answer.content)["data"][0]["id"])
        except (TransportError, orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            return None

    async def kv_event_sources(self, timeout_s: float = 10.0) -> Any:
        """vLLM's `/kv_event_sources` answer (the KV-event publisher config per data-parallel
        rank), or None when the server cannot say (an older vLLM, an error, no answer)."""
        try:
            answer = await self._post_or_get(
                "GET", endpoints.KV_EVENT_SOURCES, None, _total(timeout_s)
            )
            return orjson.loads(answer.content) if answer.status_code == 200 else None
        except (TransportError, orjson.JSONDecodeError):
            return None

    async def metrics_text(self, timeout_s: float = 5.0) -> str:
        """vLLM's `/metrics` text exposition; `TransportError` when it does not answer 200."""
        answer = await self._post_or_get("GET", endpoints.METRICS, None, _total(timeout_s))
        if answer.status_code != 200:
            raise TransportError(f"{self.where}: /metrics answered {answer.status_code}")
        return answer.content.decode("utf-8", "replace")

    async def tokenize_chat(
        self, model: str, messages: list[Any], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the chat-template rendering of `messages`; an error status raises
        `RefusedError` holding vLLM's answer (to pass on as is)."""
        path = endpoints.TOKENIZE
        payload = {
            "model": model,
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
        }
        answer = await self._post_or_get("POST", path, orjson.dumps(payload))
        if answer.status_code != 200:
            raise status_error(self.where, path, answer.status_code, answer.content)
        return [int(t) for t in orjson.loads(answer.content)["tokens"]]

    async def generate(self, generation: endpoints.Generation, content: bytes) -> RawAnswer:
        """POST `content` (a JSON body) to the chat or completions endpoint; the whole answer."""
        return await self._post_or_get("POST", endpoints.GENERATION_PATHS[generation], content)

    async def open_stream(self, generation: endpoints.Generation, content: bytes) -> UpstreamStream:
        """POST `content` and return once the status line and headers are in (close it after)."""
        path = endpoints.GENERATION_PATHS[generation]
        try:
            response = await self._send("POST", self._generation_urls[generation], content, None)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _transport_error(exc, path, self.where) from exc
        return UpstreamStream(response, path, self.where)

    async def chat_response(self, payload: dict[str, Any], timeout_s: float) -> RawAnswer:
        """POST a chat request and return the answer as it came; no answer: `UpstreamError`."""
        try:
            return await self._post_or_get(
                "POST", endpoints.CHAT, orjson.dumps(payload), _total(timeout_s)
            )
        except TransportError as exc:
            raise UpstreamError(str(exc)) from None

    async def _post_or_get(
        self,
        method: str,
        path: str,
        content: bytes | None,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> RawAnswer:
        """One request, its whole answer read (then the connection goes back to the pool)."""
        try:
            response = await self._send(method, self.url(path), content, timeout)
            async with response:
                body = await response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _transport_error(exc, path, self.where) from exc
        content_type = response.headers.get("Content-Type", "application/json")
        return RawAnswer(response.status, body, content_type)

    async def _send(
        self, method: str, url: str, content: bytes | None, timeout: aiohttp.ClientTimeout | None
    ) -> aiohttp.ClientResponse:
        """Send one request. A kept-alive connection the server closed while it sat in the pool
        (vLLM drops idle ones after 5 s) fails before any byte of an answer: that failure is
        retried once, on a new connection; a server that is really gone fails the retry too."""
        kwargs: dict[str, Any] = {"data": content, "headers": self._headers}
        if timeout is not None:
            kwargs["timeout"] = timeout
        try:
            return await self._session.request(method, url, **kwargs)
        except aiohttp.ServerDisconnectedError:
            try:
                return await self._session.request(method, url, **kwargs)
            except aiohttp.ServerDisconnectedError as exc:
                raise UnreachedError(f"{self.where}: {url} closed without answering") from exc


def _total(timeout_s: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=timeout_s)
