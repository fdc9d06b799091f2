"""The paths of a vLLM OpenAI-compatible server and how a base URL becomes a request URL: the one
place a vLLM address is built (the router serves the same paths, so it routes by them too)."""

from __future__ import annotations

from typing import Literal

HEALTH = "/health"
MODELS = "/v1/models"
METRICS = "/metrics"
TOKENIZE = "/tokenize"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
IS_SLEEPING = "/is_sleeping"  # VLLM_SERVER_DEV_MODE=1 only
RESET_PREFIX_CACHE = "/reset_prefix_cache"  # VLLM_SERVER_DEV_MODE=1 only
KV_EVENT_SOURCES = "/kv_event_sources"  # the KV-event publishers (--kv-events-config), per rank

Generation = Literal["chat", "completions"]
GENERATION_PATHS: dict[Generation, str] = {"chat": CHAT, "completions": COMPLETIONS}
JSON_CONTENT = {"Content-Type": "application/json"}


def base_url(url: str) -> str:
    """The server's root for a URL given with or without a trailing '/' or '/v1'.

    >>> base_url("http://h:8000/v1/")
    'http://h:8000'
    """
    return url.rstrip("/").removesuffix("/v1")


def url_of(base: str, path: str) -> str:
    """`path` on the server at `base` (any form `base_url` accepts)."""
    return base_url(base) + path


def request_headers(api_key: str | None) -> dict[str, str]:
    """JSON content type, and the bearer token when there is one (vLLM --api-key)."""
    if not api_key:
        return dict(JSON_CONTENT)
    return {**JSON_CONTENT, "Authorization": f"Bearer {api_key}"}
