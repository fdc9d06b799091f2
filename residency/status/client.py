"""Where `residency status` reads its picture from a running router: its `GET /residency`
(`router_source`; a vLLM server's own KV events are read by serve/direct_status.py's
`direct_source`). Each source is an async context yielding a coroutine function that reads the
picture now (`Reader`); failures are one `UpstreamError` line."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from pydantic import ValidationError

from residency.errors import UpstreamError
from residency.status.model import ResidencyStatus, UpstreamStatus
from residency.vllm_client import endpoints

Reader = Callable[[], Awaitable[ResidencyStatus]]
TIMEOUT_S = 10.0


@contextlib.asynccontextmanager
async def router_source(url: str, api_key: str | None, last: int) -> AsyncIterator[Reader]:
    """The router at `url`."""
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=TIMEOUT_S) as client:

        async def read() -> ResidencyStatus:
            try:
                answer = await client.get("/residency", params={"last": last})
            except httpx.HTTPError as exc:
                raise UpstreamError(
                    f"status: cannot reach the router at {base} ({type(exc).__name__}: {exc})"
                ) from None
            if answer.status_code == 401:
                raise UpstreamError(f"status: {base} wants an API key: give --api-key")
            if answer.status_code == 404:  # a vLLM server, nothing planned: one line
                return await _unplanned(client, base)
            if answer.status_code != 200:
                raise UpstreamError(
                    f"status: {base}/residency answered {answer.status_code}: {answer.text[:200]}"
                )
            try:
                return ResidencyStatus.model_validate_json(answer.content)
            except ValidationError as exc:
                raise UpstreamError(
                    f"status: {base}/residency is not a residency picture "
                    f"({exc.errors()[0]['msg']}; router and CLI of different versions?)"
                ) from None

        yield read


async def _unplanned(client: httpx.AsyncClient, base: str) -> ResidencyStatus:
    """A server with no /residency: a vLLM server read without a plan (give --plan for its
    prefixes), shown as one line, its health and whether it publishes KV events."""
    from residency.vllm_client.kv_events import first_source, sources_from

    health = await client.get(endpoints.HEALTH)
    sources = await client.get(endpoints.KV_EVENT_SOURCES)
    if health.status_code == 404 and sources.status_code == 404:
        raise UpstreamError(f"status: {base} is neither a residency router nor a vLLM server")
    listed = sources.json() if sources.status_code == 200 else None
    events = first_source(sources_from(listed, base)) is not None
    up = UpstreamStatus(
        upstream="0",
        healthy=health.status_code == 200,
        mode="events" if events else "token_count",
        evictions=0,
    )
    return ResidencyStatus(
        plan_sha256="none", recent_requests=1, ready=True, missing=[], upstreams=[up], prefixes=[]
    )
