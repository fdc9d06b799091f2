"""The router's HTTP endpoints: vLLM's own paths (chat, completions, models, health, metrics),
readiness and the residency picture. Each reads the running service from the lifespan's state
(`request.state.service`, set by app.py)."""

from __future__ import annotations

import logging

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from residency.serve.errors import error_response, unavailable
from residency.serve.forensics import RECENT_REQUESTS
from residency.serve.router import Router
from residency.serve.service import RouterService
from residency.serve.status_view import residency_status
from residency.status.model import ResidencyStatus
from residency.vllm_client import TransportError, endpoints

log = logging.getLogger("residency.serve")
JSON = "application/json"
READY = "/ready"  # readiness: every planned prefix resident on a healthy upstream
RESIDENCY = "/residency"  # the residency picture `residency status` reads
OPEN_PATHS = frozenset({endpoints.HEALTH, READY})  # probes carry no API key
MODEL_FIELDS = ("id", "object", "created", "owned_by", "max_model_len")


def router_of(request: Request) -> Router:
    """The running router (the lifespan's state)."""
    service: RouterService = request.state.service
    return service.router


async def chat(request: Request) -> Response:
    """POST /v1/chat/completions."""
    return await router_of(request).handle(request, "chat")


async def completions(request: Request) -> Response:
    """POST /v1/completions."""
    return await router_of(request).handle(request, "completions")


async def models(request: Request) -> Response:
    """GET /v1/models: the first usable upstream's list, served names only."""
    router = router_of(request)
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
    """GET /health: 200 while an upstream is usable, 503 when none is or while draining."""
    router = router_of(request)
    if router.drain.draining:  # balancers stop sending before the router stops accepting
        return Response(orjson.dumps({"status": "draining"}), 503, media_type=JSON)
    usable = sum(u.usable for u in router.pool.upstreams)
    body: dict[str, object] = {"status": "ok" if usable else "unavailable"}
    body["upstreams_usable"] = usable
    body["upstreams"] = len(router.pool.upstreams)
    body["plan_sha256"] = router.state.plan_sha256
    return Response(orjson.dumps(body), 200 if usable else 503, media_type=JSON)


def picture(router: Router, last: int = RECENT_REQUESTS) -> ResidencyStatus:
    """The residency picture now: the plan's prefixes on every upstream."""
    current = router.state
    return residency_status(
        current.plan_sha256,
        [p.id for p in current.builder.plan.all_prefixes()],
        router.pool.upstreams,
        router.keeper.engine,
        router.forensics,
        last,
    )


async def ready(request: Request) -> Response:
    """GET /ready: 200 once every planned prefix is resident on a usable upstream."""
    router = router_of(request)
    if router.drain.draining:  # not ready for new traffic once shutting down, resident or not
        return Response(orjson.dumps({"status": "draining", "missing": []}), 503, media_type=JSON)
    now = picture(router)
    body = {"status": "ready" if now.ready else "not_ready", "missing": now.missing}
    return Response(orjson.dumps(body), 200 if now.ready else 503, media_type=JSON)


async def residency(request: Request) -> Response:
    """GET /residency?last=N: the picture `residency status` reads."""
    raw = request.query_params.get("last", str(RECENT_REQUESTS))
    last = int(raw) if raw.isdigit() and 0 < int(raw) <= RECENT_REQUESTS else None
    if last is None:
        message = f"last={raw!r}: give a whole number from 1 to {RECENT_REQUESTS}"
        return error_response(400, message, "invalid_request_error")
    return Response(picture(router_of(request), last).model_dump_json(), media_type=JSON)


async def prometheus(request: Request) -> Response:
    """GET /metrics."""
    registry = router_of(request).metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 / 405 as OpenAI-shaped errors."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status == 404:
        return error_response(404, f"no route {request.url.path}", "invalid_request_error")
    if status == 405:
        return error_response(405, "method not allowed", "invalid_request_error")
    return error_response(status, "request failed", "invalid_request_error")


async def internal_error(request: Request, exc: Exception) -> Response:
    """A bug: logged with its traceback, answered as a server error."""
    log.exception("internal error on %s", request.url.path, exc_info=exc)
    return error_response(500, "internal error in the router", "server_error")


ROUTES = [
    # The paths vLLM serves: the router stands in for it.
    Route(endpoints.CHAT, chat, methods=["POST"]),
    Route(endpoints.COMPLETIONS, completions, methods=["POST"]),
    Route(endpoints.MODELS, models, methods=["GET"]),
    Route(endpoints.HEALTH, health, methods=["GET"]),
    Route(endpoints.METRICS, prometheus, methods=["GET"]),
    Route(READY, ready, methods=["GET"]),
    Route(RESIDENCY, residency, methods=["GET"]),
]
ERROR_HANDLERS = {HTTPException: http_error, Exception: internal_error}


def served_models(content: bytes, status: int) -> Response:
    """vLLM's /v1/models with the served names only: `root` and `parent` hold the model's
    filesystem path, which is the operator's business."""
    try:
        listed = orjson.loads(content)
        data = [{k: m[k] for k in MODEL_FIELDS if k in m} for m in listed["data"]]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return error_response(502, "the model server's model list is unreadable", "server_error")
    body = {"object": "list", "data": data}
    return Response(orjson.dumps(body), status, media_type=JSON)
