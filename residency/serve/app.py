"""The ASGI app of `residency serve`: the routes (routes.py), the API-key check, CORS and the
request guard around them, and the router service (service.py) as the app's lifespan."""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import AsyncIterator, Mapping

from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from residency.serve.drain import Drain
from residency.serve.errors import error_response
from residency.serve.guard import RequestGuard, Slots
from residency.serve.routes import ERROR_HANDLERS, OPEN_PATHS, READY, RESIDENCY, ROUTES
from residency.serve.series import initialise_series
from residency.serve.service import RouterService
from residency.serve.settings import ServeSettings
from residency.serve.state import Current, ServingState
from residency.serve.telemetry import RouterMetrics

__all__ = ["OPEN_PATHS", "READY", "RESIDENCY", "ApiKeyMiddleware", "create_app"]


def create_app(
    settings: ServeSettings, serving: ServingState, drain: Drain | None = None
) -> ASGIApp:
    """The router app for validated settings and the first plan's serving state; `drain` is
    the shutdown state run.py's server sets on SIGTERM."""
    drain = drain if drain is not None else Drain(settings.shutdown_timeout_s)
    metrics = RouterMetrics()
    metrics.set_plan(serving.plan_sha256)
    labels = [str(i) for i in range(len(settings.upstreams))]
    initialise_series(metrics, labels, [p.id for p in serving.builder.plan.all_prefixes()])
    slots = Slots(settings.limits.max_concurrent)
    metrics.slots_in_use.set_function(lambda: slots.in_flight)
    current = Current(serving)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[Mapping[str, RouterService]]:
        async with RouterService.serving(settings, current, metrics, slots, drain) as service:
            yield {"service": service}  # request.state.service in routes.py

    app: ASGIApp = Starlette(
        routes=ROUTES, lifespan=lifespan, exception_handlers=dict(ERROR_HANDLERS)
    )
    if settings.api_key:
        app = ApiKeyMiddleware(app, settings.api_key)
    if settings.allow_origins:  # preflights and CORS headers for the pages let in
        app = CORSMiddleware(
            app,
            allow_origins=list(settings.allow_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    return RequestGuard(app, settings, slots)


class ApiKeyMiddleware:
    """Requires `Authorization: Bearer <key>` on every path but /health."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or []).get(b"authorization", b"")
        token = header[7:] if header[:7].lower() == b"bearer " else b""
        if not hmac.compare_digest(token, self._key):
            response = error_response(
                401, "missing or wrong API key", "authentication_error", "invalid_api_key"
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
