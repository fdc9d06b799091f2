"""HTTP client for one vLLM OpenAI-compatible server. Talks and parses; decides nothing."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from pydantic import BaseModel, ConfigDict, Field

from residency.errors import UpstreamError
from residency.metrics import Sample, find_samples, parse_prometheus

CACHE_CONFIG_METRIC = "vllm:cache_config_info"


class ServedModel(BaseModel):
    """One entry of `/v1/models`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(description="Served model name.")
    root: str | None = Field(default=None, description="Model path or repo the server loaded.")
    max_model_len: int | None = Field(default=None, description="The server's max_model_len.")


class VllmClient:
    """Synchronous client for one server's `/health`, `/v1/models`, `/metrics`, `/tokenize`."""

    def __init__(self, base_url: str, *, timeout_s: float = 10.0, api_key: str | None = None):
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers)

    def close(self) -> None:
        """Release the connection pool."""
        self._http.close()

    def __enter__(self) -> VllmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, path: str) -> httpx.Response:
        try:
            response = self._http.get(path)
        except httpx.HTTPError as exc:
            raise UpstreamError(
                f"--server {self.base_url}: cannot reach {path} ({type(exc).__name__}); "
                "is vLLM running there?"
            ) from None
        if response.status_code != 200:
            raise UpstreamError(
                f"--server {self.base_url}: {path} answered HTTP {response.status_code}"
            )
        return response

    def _json(self, path: str, response: httpx.Response) -> Any:
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise UpstreamError(f"--server {self.base_url}: {path} did not return JSON") from None

    def health(self) -> bool:
        """True when `/health` answers 200."""
        try:
            return self._http.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    def models(self) -> list[ServedModel]:
        """The served models (`/v1/models`)."""
        body = self._json("/v1/models", self._get("/v1/models"))
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or not data:
            raise UpstreamError(f"--server {self.base_url}: /v1/models lists no model")
        return [ServedModel.model_validate(item) for item in data]

    def metrics(self) -> list[Sample]:
        """All samples of `/metrics`."""
        return parse_prometheus(self._get("/metrics").text)

    def cache_config_info(self) -> dict[str, str]:
        """Labels of `vllm:cache_config_info`: block_size, num_gpu_blocks, ..."""
        found = find_samples(self.metrics(), CACHE_CONFIG_METRIC)
        if not found:
            raise UpstreamError(
                f"--server {self.base_url}: /metrics has no {CACHE_CONFIG_METRIC}; "
                "is this a vLLM server with metrics enabled?"
            )
        return found[0].labels

    def tokenize(self, prompt: str, *, model: str | None = None) -> list[int]:
        """Token ids of `prompt` with the server's tokenizer (`/tokenize`, no special tokens)."""
        payload: dict[str, Any] = {"prompt": prompt, "add_special_tokens": False}
        if model:
            payload["model"] = model
        try:
            response = self._http.post(
                "/tokenize",
                content=orjson.dumps(payload),
                headers={"Content-Type": "application/json"},
            )
        except httpx.HTTPError as exc:
            raise UpstreamError(
                f"--server {self.base_url}: cannot reach /tokenize ({type(exc).__name__})"
            ) from None
        if response.status_code != 200:
            raise UpstreamError(
                f"--server {self.base_url}: /tokenize answered HTTP {response.status_code}"
            )
        tokens = self._json("/tokenize", response).get("tokens")
        if not isinstance(tokens, list):
            raise UpstreamError(f"--server {self.base_url}: /tokenize returned no tokens")
        return [int(t) for t in tokens]
