"""The ASGI app of `residency serve`: routes, API-key check, startup (index, upstreams, warm)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import signal
from collections.abc import AsyncIterator

import anyio
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from residency.errors import ResidencyError, UpstreamMismatchError
from residency.serve.canary import RecallCanary
from residency.serve.drain import Drain
from residency.serve.errors import error_response, unavailable
from residency.serve.failover import FailoverWarmer
from residency.serve.forensics import RECENT_REQUESTS
from residency.serve.guard import RequestGuard, Slots
from residency.serve.kv_residency import EngineResidency
from residency.serve.reload import PlanReloader
from residency.serve.replan import Replanner
from residency.serve.replica_keeper import ReplicaKeeper
from residency.serve.replicas import replica_plan
from residency.serve.router import Router
from residency.serve.series import initialise_series
from residency.serve.settings import WATCH_PLAN_INTERVAL_S, ServeSettings
from residency.serve.state import ServingState
from residency.serve.status_model import ResidencyStatus
from residency.serve.status_view import residency_status
from residency.serve.telemetry import RouterMetrics
from residency.serve.upstreams import Upstream, UpstreamPool
from residency.vllm_client import TransportError, endpoints, open_session
from residency.warm import WarmOptions, warm

log = logging.getLogger("residency.serve")
JSON = "application/json"
READY = "/ready"  # readiness: every planned prefix resident on a healthy upstream
RESIDENCY = "/residency"  # the residency picture `residency status` reads
OPEN_PATHS = frozenset({endpoints.HEALTH, READY})  # probes carry no API key


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
    state: dict[str, Router] = {}

    async def on_join(up: Upstream) -> bool:
        if settings.replicas:  # a router in front: the replicas are warmed by ReplicaKeeper
            return True
        engine = state["router"].keep_warm.engine if "router" in state else None
        if engine is not None:  # before the warm, so that its stores are seen
            await engine.attach(up)
        if not settings.warm:
            if engine is not None:
                engine.refresh_soon(up)
            return True
        options = WarmOptions(
            server=up.url,
            request_timeout_s=settings.request_timeout_s,
            api_key=settings.upstream_api_key,
        )
        try:
            current = state["router"].state if "router" in state else serving
            held = replica_plan(current.builder.plan, up.position)  # its placed prefixes
            if held is None:
                return True
            report = await anyio.to_thread.run_sync(warm, held, options)
        except ResidencyError as exc:
            if isinstance(exc, UpstreamMismatchError):
                up.excluded = str(exc)
                log.error("upstream %s excluded: %s", up.label, exc)
                return False
            log.warning("upstream %s: warm failed (%s); serving it cold", up.label, exc)
            return True
        if "router" in state:
            state["router"].keep_warm.warmed(up)
        every = report.prefixes
        log.info(
            "upstream %s warmed: %d of %d shared tokens cached (%d of %d prefixes resident)",
            up.label,
            sum(p.cached_tokens for p in every) if every else report.cached_tokens,
            sum(p.shared_prefix_tokens for p in every) if every else report.shared_prefix_tokens,
            sum(p.resident for p in every) if every else int(report.resident),
            len(every) or 1,
        )
        return True

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_session(settings.request_timeout_s) as http:
            pool = UpstreamPool(
                settings.upstreams,
                http,
                metrics,
                settings.health_interval_s,
                on_join,
                api_key=settings.upstream_api_key,
            )
            await anyio.to_thread.run_sync(serving.builder.warm_up)
            router = state["router"] = Router(settings, serving, pool, http, metrics, slots)
            router.drain = drain
            router.keep_warm.engine = EngineResidency(
                settings, metrics.agent, lambda: router.state.builder.plan
            )
            router.keep_warm.engine.observer = router.forensics
            await pool.start()
            keeper = None
            if settings.replicas:
                keeper = ReplicaKeeper(
                    settings.replicas,
                    http,
                    lambda: router.state.builder.plan,
                    interval_s=settings.health_interval_s,
                    request_timeout_s=settings.request_timeout_s,
                    api_key=settings.upstream_api_key,
                )
                await keeper.start()
            tasks: set[asyncio.Task[object]] = {asyncio.create_task(_sync_log_every(router, 1.0))}
            if serving.builder.plan.placement is not None:  # a replica down: survivors take over
                failover = FailoverWarmer(
                    keeper.pool if keeper is not None else pool,
                    lambda: router.state.builder.plan,
                    interval_s=settings.health_interval_s,
                    request_timeout_s=settings.request_timeout_s,
                    api_key=settings.upstream_api_key,
                )
                tasks.add(asyncio.create_task(failover.run()))
            reloader = PlanReloader(settings, router, metrics)
            if settings.watch_plan:
                tasks.add(asyncio.create_task(reloader.watch(WATCH_PLAN_INTERVAL_S)))
            agent = settings.agent
            if agent.replan_every_s is not None and settings.log is not None:
                replanner = Replanner(settings, reloader, metrics.agent, settings.log)
                tasks.add(asyncio.create_task(replanner.run()))
            if agent.canary is not None:
                canary = RecallCanary(agent, metrics.agent, lambda: router.state)
                tasks.add(asyncio.create_task(canary.run()))
            loop = asyncio.get_running_loop()

            def on_sighup() -> None:  # logrotate's signal and the plan's, both
                router.reopen_log("SIGHUP")
                task = loop.create_task(reloader.reload("SIGHUP"))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

            # uvicorn handles SIGINT and SIGTERM only; SIGHUP and SIGUSR1 would otherwise end
            # the process.
            loop.add_signal_handler(signal.SIGHUP, on_sighup)
            loop.add_signal_handler(signal.SIGUSR1, router.reopen_log, "SIGUSR1")
            try:
                yield
            finally:
                loop.remove_signal_handler(signal.SIGHUP)
                loop.remove_signal_handler(signal.SIGUSR1)
                for task in tasks:
                    task.cancel()
                await router.keep_warm.stop()
                await router.forensics.stop()
                await pool.stop()
                if keeper is not None:
                    await keeper.stop()
                router.close()

    async def chat(request: Request) -> Response:
        return await state["router"].handle(request, "chat")

    async def completions(request: Request) -> Response:
        return await state["router"].handle(request, "completions")

    async def models(request: Request) -> Response:
        router = state["router"]
        ups = [u for u in router.pool.upstreams if u.usable]
        if not ups:
            return unavailable(len(router.pool.upstreams))
        try:
            answer = await ups[0].client.models_answer(timeout_s=10.0)
        except TransportError:
            router.pool.mark_down(ups[0])
            return unavailable(len(router.pool.upstreams))
        return served_models(answer.content, answer.status_code)

    async def health(request: Request) -> Response:
        router = state["router"]
        usable = sum(u.usable for u in router.pool.upstreams)
        if drain.draining:  # balancers stop sending before the router stops accepting
            body: dict[str, object] = {"status": "draining"}
            return Response(orjson.dumps(body), 503, media_type="application/json")
        body = {"status": "ok" if usable else "unavailable"}
        body["upstreams_usable"] = usable
        body["upstreams"] = len(router.pool.upstreams)
        body["plan_sha256"] = router.state.plan_sha256
        return Response(orjson.dumps(body), 200 if usable else 503, media_type="application/json")

    def picture(last: int = RECENT_REQUESTS) -> ResidencyStatus:
        router = state["router"]
        current = router.state
        return residency_status(
            current.plan_sha256,
            [p.id for p in current.builder.plan.all_prefixes()],
            router.pool.upstreams,
            router.keep_warm.engine,
            router.forensics,
            last,
        )

    async def ready(request: Request) -> Response:
        if drain.draining:  # not ready for new traffic once shutting down, resident or not
            return Response(
                orjson.dumps({"status": "draining", "missing": []}), 503, media_type=JSON
            )
        now = picture()
        body = {"status": "ready" if now.ready else "not_ready", "missing": now.missing}
        return Response(orjson.dumps(body), 200 if now.ready else 503, media_type=JSON)

    async def residency(request: Request) -> Response:
        raw = request.query_params.get("last", str(RECENT_REQUESTS))
        last = int(raw) if raw.isdigit() and 0 < int(raw) <= RECENT_REQUESTS else None
        if last is None:
            message = f"last={raw!r}: give a whole number from 1 to {RECENT_REQUESTS}"
            return error_response(400, message, "invalid_request_error")
        return Response(picture(last).model_dump_json(), media_type=JSON)

    async def prometheus(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        if status == 404:
            return error_response(404, f"no route {request.url.path}", "invalid_request_error")
        if status == 405:
            return error_response(405, "method not allowed", "invalid_request_error")
        return error_response(status, "request failed", "invalid_request_error")

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s", request.url.path, exc_info=exc)
        return error_response(500, "internal error in the router", "server_error")

    app: ASGIApp = Starlette(
        routes=[
            # The paths vLLM serves: the router stands in for it.
            Route(endpoints.CHAT, chat, methods=["POST"]),
            Route(endpoints.COMPLETIONS, completions, methods=["POST"]),
            Route(endpoints.MODELS, models, methods=["GET"]),
            Route(endpoints.HEALTH, health, methods=["GET"]),
            Route(endpoints.METRICS, prometheus, methods=["GET"]),
            Route(READY, ready, methods=["GET"]),
            Route(RESIDENCY, residency, methods=["GET"]),
        ],
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error, Exception: internal_error},
    )
    if settings.api_key:
        app = ApiKeyMiddleware(app, settings.api_key)
    if settings.allow_origins:  # preflights and CORS headers for the pages let in
        app = CORSMiddleware(
            app, allow_origins=list(settings.allow_origins), allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )  # fmt: skip
    return RequestGuard(app, settings, slots)


MODEL_FIELDS = ("id", "object", "created", "owned_by", "max_model_len")


def served_models(content: bytes, status: int) -> Response:
    """vLLM's /v1/models with the served names only: `root` and `parent` hold the model's
    filesystem path, which is the operator's business."""
    try:
        listed = orjson.loads(content)
        data = [{k: m[k] for k in MODEL_FIELDS if k in m} for m in listed["data"]]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return error_response(502, "the model server's model list is unreadable", "server_error")
    body = {"object": "list", "data": data}
    return Response(orjson.dumps(body), status, media_type="application/json")


async def _sync_log_every(router: Router, interval_s: float) -> None:
    """Flush the query log to disk once per interval, off the request path."""
    while True:
        await asyncio.sleep(interval_s)
        await anyio.to_thread.run_sync(router.sync_log)


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
