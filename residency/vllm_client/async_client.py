"""The asynchronous client of one vLLM server, for the router and its pruner: health, the served
model, chat tokenization, and generation requests whose bytes the router passes through.

The hot-path calls (`tokenize_chat`, `send`) let httpx's transport errors through unchanged, so
the router can tell a request that never reached vLLM (retry elsewhere) from one that failed
mid-answer; the others answer False / None, or raise `UpstreamError`.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from residency.vllm_client import endpoints
from residency.vllm_client.wire import RawAnswer, status_error, transport_error


class AsyncVllmClient:
    """One server at `base_url`, over a shared `httpx.AsyncClient` (the caller's pool)."""

    def __init__(
        self,
        base_url: str,
        http: httpx.AsyncClient,
        *,
        api_key: str | None = None,
        flag: str = "--upstream",
    ) -> None:
        self.base_url = endpoints.base_url(base_url)
        self.where = f"{flag} {self.base_url}"
        self._http = http
        self._headers = endpoints.request_headers(api_key)

    def url(self, path: str) -> str:
        """The full URL of `path` on this server."""
        return self.base_url + path

    async def health(self, timeout_s: float = 5.0) -> bool:
        """True when `/health` answers 200."""
        try:
            response = await self._http.get(
                self.url(endpoints.HEALTH), headers=self._headers, timeout=timeout_s
            )
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def models_answer(self, timeout_s: float = 10.0) -> RawAnswer:
        """`/v1/models` as it came (httpx errors propagate: the caller marks the server down)."""
        response = await self._http.get(
            self.url(endpoints.MODELS), headers=self._headers, timeout=timeout_s
        )
        return RawAnswer(response.status_code, response.content)

    async def first_model(self, timeout_s: float = 10.0) -> str | None:
        """The first served model's id, or None when `/v1/models` cannot say."""
        try:
            answer = await self.models_answer(timeout_s)
            return str(orjson.loads(answer.content)["data"][0]["id"])
        except (httpx.HTTPError, orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            return None

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
        response = await self._http.post(
            self.url(path), content=orjson.dumps(payload), headers=self._headers
        )
        if response.status_code != 200:
            raise status_error(self.where, path, response.status_code, response.content)
        return [int(t) for t in orjson.loads(response.content)["tokens"]]

    def request(self, generation: endpoints.Generation, content: bytes) -> httpx.Request:
        """A POST of `content` (a JSON body) to the chat or completions endpoint."""
        path = endpoints.GENERATION_PATHS[generation]
        return self._http.build_request(
            "POST", self.url(path), content=content, headers=self._headers
        )

    async def send(self, request: httpx.Request, stream: bool = False) -> httpx.Response:
        """Send a request built by `request` (streamed: the caller reads and closes it)."""
        return await self._http.send(request, stream=stream)

    async def chat_response(self, payload: dict[str, Any], timeout_s: float) -> RawAnswer:
        """POST a chat request and return the answer as it came; no answer: `UpstreamError`."""
        path = endpoints.CHAT
        try:
            response = await self._http.post(
                self.url(path), content=orjson.dumps(payload), headers=self._headers,
                timeout=timeout_s,
            )  # fmt: skip
        except httpx.HTTPError as exc:
            raise transport_error(self.where, path, exc) from None
        return RawAnswer(
            response.status_code,
            response.content,
            response.headers.get("content-type", "application/json"),
        )
