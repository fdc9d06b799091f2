"""The request path: read and validate (guard.py, validation.py), retrieve and route, assemble the
prompt, forward to the least busy upstream, stream its bytes back, log and count it.

Streams pass through event by event, untouched, except the usage-only chunk the router asks for
(`stream_options.include_usage`, to read cached tokens) when the client did not ask for it. An
upstream that fails before answering is retried on the next one; one that dies mid-stream ends the
client's stream with an OpenAI-shaped error event and `[DONE]`. Only transport failures take an
upstream out of rotation, never what a client's request made it answer. A client that disconnects
cancels the upstream request (closing its connection makes vLLM abort it). SIGTERM: drain.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from residency.context.prompt import assemble_messages
from residency.errors import BackendError
from residency.keep.keeper import ResidencyKeeper
from residency.planning.plan_model import ResidencyPlan
from residency.planning.replicas import prefix_holders
from residency.serve import drain as shutdown
from residency.serve.errors import error_response, unavailable
from residency.serve.exchange import Endpoint, Exchange
from residency.serve.exchange_record import log_record
from residency.serve.failover import effective_plan
from residency.serve.forensics import Forensics
from residency.serve.guard import ClientGoneError, Slots, read_body, wait_disconnect
from residency.serve.record import Outcome, RouterQueryLog, source_of
from residency.serve.settings import ServeSettings
from residency.serve.state import Current, ServingState
from residency.serve.telemetry import RouterMetrics
from residency.serve.upstreams import NoUpstreamError, Upstream, UpstreamPool
from residency.serve.validation import ClientRequest, RequestError, parse_request
from residency.vllm_client import (
    AnswerTimeoutError,
    RefusedError,
    Session,
    TransportError,
    UnreachedError,
    UpstreamStream,
    Usage,
)
from residency.vllm_client.sse import DONE, EventSplitter, error_event, usage_of
from residency.vllm_client.wire import answer_usage

log = logging.getLogger("residency.serve")
# Bodies larger than this are parsed and re-encoded in a worker thread: orjson and pydantic hold
# the GIL either way, but the event loop then gets its turn every switch interval (5 ms) instead
# of waiting out a whole multi-megabyte parse.
INLINE_BODY_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class RouterParts:
    """What a router serves with, each built on its own (serve/service.py builds them)."""

    current: Current  # the serving state, swapped whole on reload
    pool: UpstreamPool
    http: Session
    metrics: RouterMetrics
    slots: Slots
    keeper: ResidencyKeeper
    forensics: Forensics
    drain: shutdown.Drain
    log: RouterQueryLog | None


class Router:
    """Serves each request with the parts it is given: the current plan's context builder, the
    upstream pool, the residency keeper, the forensics, the metrics and the query log."""

    def __init__(self, settings: ServeSettings, parts: RouterParts) -> None:
        self.settings = settings
        self.current = parts.current
        self.pool = parts.pool
        self.http = parts.http
        self.metrics = parts.metrics
        self.slots = parts.slots
        self.keeper = parts.keeper
        self.forensics = parts.forensics
        self.drain = parts.drain
        self.log = parts.log
        self._limiter = anyio.CapacityLimiter(2)

    @property
    def state(self) -> ServingState:
        """The serving state now (a request keeps the one it started with)."""
        return self.current.state

    async def handle(self, request: Request, endpoint: Endpoint) -> Response:
        """Serve one chat or completions request."""
        arrived = time.perf_counter()
        ts = dt.datetime.now(dt.UTC)
        builder = self.state.builder  # this request's plan to the end, whatever reloads meanwhile
        admitted = await self._admit(request, endpoint)
        if isinstance(admitted, Response):
            return admitted
        req, large = admitted
        question = req.question[: self.settings.limits.max_question_chars]
        retrieval = builder.recall(question)  # asked before: a lookup, no thread, no search
        try:  # off the event loop: a long question must not stall health checks and streams
            if retrieval is None:
                retrieval = await anyio.to_thread.run_sync(
                    builder.retrieve, question, None, limiter=self._limiter
                )
        except BackendError as exc:  # Qdrant down: the client may retry, nothing internal shown
            log.error("retrieval backend: %s", exc)
            message = "retrieval is unavailable; retry shortly"
            return error_response(503, message, "service_unavailable", "retrieval_unavailable")
        self.metrics.retrieval.observe(retrieval.retrieval_s)
        ctx = await builder.finish(retrieval, self.http)
        if ctx.prune is not None:
            self.metrics.prune.observe(ctx.prune.elapsed_s)
            if not ctx.prune.valid:
                self.metrics.pruner_invalid.inc()
        ex = Exchange(endpoint, ctx, started=arrived, ts=ts, source=source_of(request.scope))
        prefix_text = builder.prefix_text(retrieval.prefix_id)
        assembled = assemble_messages(req.messages, prefix_text, ctx.block)
        if req.stream:
            options = req.body.get("stream_options") or {}
            req.body["stream_options"] = {**options, "include_usage": True}
        return await self._forward(request, ex, req, assembled, large, builder.plan)

    async def _admit(
        self, request: Request, endpoint: Endpoint
    ) -> tuple[ClientRequest, bool] | Response:
        """Read and validate the body, then take a slot: the request and whether its body is
        large (parsed and re-encoded off the event loop), or the answer that refuses it."""
        limits = self.settings.limits
        try:
            with self.metrics.bodies_receiving.track_inprogress():
                raw = await read_body(request, limits)
            allow, max_n = self.settings.allow_prompt_readback, limits.max_n
            large = len(raw) > INLINE_BODY_BYTES
            if large:  # parsing megabytes must not stall other requests
                req = await anyio.to_thread.run_sync(parse_request, raw, endpoint, allow, max_n)
            else:
                req = parse_request(raw, endpoint, allow, max_n)
            # Only now, with the whole body in: a half-sent body holds no slot.
            self.slots.take(request.scope, req.fan_out)
        except RequestError as exc:
            return exc.response()
        except ClientGoneError:  # nothing to answer, nothing to log: no question arrived
            return Response(status_code=499)
        return req, large

    async def _forward(
        self,
        request: Request,
        ex: Exchange,
        req: ClientRequest,
        assembled: list[Any],
        large: bool,
        plan: ResidencyPlan,
    ) -> Response:
        """Send to the least busy upstream holding the prefix, the next while none is reached."""
        tried: list[Upstream] = []
        prefix_id = ex.ctx.retrieval.prefix_id
        while True:
            try:
                placed = effective_plan(plan, self.pool.usable_positions)
                holders = prefix_holders(placed, prefix_id) if prefix_id else None
                up = self.pool.pick(exclude=tried, holders=holders)
            except NoUpstreamError:
                return self._finish_error(ex, unavailable(len(self.pool.upstreams)))
            try:
                await self.keeper.ready(up, prefix_id)  # a re-warm under way
                payload = await self._payload(up, ex.endpoint, req.body, assembled, large)
                if req.stream:
                    return await self._stream(request, ex, up, payload, req.client_usage)
                return await self._unary(request, ex, up, payload)
            except UnreachedError:  # nothing reached vLLM: try the next upstream
                self.pool.mark_down(up)
                tried.append(up)
            except RefusedError as refused:  # vLLM refused the request itself (e.g. 400)
                ex.upstream = up
                answer = refused.answer  # completions: vLLM's /tokenize refused the prompt
                response = Response(
                    answer.content, answer.status_code, media_type="application/json"
                )
                return self._finish_error(ex, response, "client_error")
            except AnswerTimeoutError:
                ex.upstream = up
                message = "the model server did not answer within --request-timeout"
                response = error_response(504, message, "server_error", "upstream_timeout")
                return self._finish_error(ex, response, "upstream_error")
            except TransportError:
                self.pool.mark_down(up)
                if not req.stream:  # nothing reached the client yet: another upstream answers
                    tried.append(up)
                    continue
                ex.upstream = up
                message = "the model server failed while answering; retry shortly"
                response = error_response(502, message, "server_error", "upstream_error")
                return self._finish_error(ex, response, "upstream_error")

    async def _payload(
        self,
        up: Upstream,
        endpoint: Endpoint,
        body: dict[str, Any],
        assembled: list[Any],
        large: bool = False,
    ) -> bytes:
        out = dict(body)
        out.setdefault("model", up.model)
        if endpoint == "chat":
            out["messages"] = assembled
        else:
            # Completions take raw text; render the same chat shape (and so the same cached
            # prefix) through the upstream's own template and send its token ids.
            out["prompt"] = await up.client.tokenize_chat(out["model"], assembled)
        if large:  # the client's megabytes again, on their way upstream
            return await anyio.to_thread.run_sync(orjson.dumps, out)
        return orjson.dumps(out)

    def _forwarded(self, ex: Exchange, up: Upstream) -> None:
        ex.forward_s = time.perf_counter() - ex.started
        r = ex.ctx.retrieval
        ex.admission = self.forensics.admitted(up.label, r.prefix_id, r.route)

    async def _unary(
        self, request: Request, ex: Exchange, up: Upstream, payload: bytes
    ) -> Response:
        async with self.pool.lease(up):
            self._forwarded(ex, up)
            task = asyncio.ensure_future(up.client.generate(ex.endpoint, payload))
            gone = asyncio.ensure_future(wait_disconnect(request))
            try:
                done = await shutdown.first_done({task, gone}, self.drain.expired)
            except shutdown.DrainExpiredError:  # vLLM aborts it; the client may retry elsewhere
                ex.upstream = up
                return self._finish_error(ex, shutdown.shutting_down())
            if task not in done:
                task.cancel()  # closes the upstream connection: vLLM aborts the request
                ex.upstream, ex.outcome, ex.status_code = up, "disconnected", 499
                self._log(ex)
                return Response(status_code=499)
            gone.cancel()
            answer = task.result()  # a transport error propagates to handle()
        ex.upstream, ex.status_code = up, answer.status_code
        ex.ttft_s = time.perf_counter() - ex.started
        if answer.status_code == 200:
            ex.usage = answer_usage(answer.content)
        elif answer.status_code >= 500:
            ex.outcome = "upstream_error"
        else:
            ex.outcome = "client_error"
        return Response(
            answer.content,
            status_code=answer.status_code,
            media_type=answer.content_type,
            headers=ex.headers(),
            background=BackgroundTask(self._log_after, ex),  # logged after the answer is sent
        )

    async def _stream(
        self, request: Request, ex: Exchange, up: Upstream, payload: bytes, client_usage: bool
    ) -> Response:
        await self.pool.acquire(up)
        try:
            self._forwarded(ex, up)
            opening = up.client.open_stream(ex.endpoint, payload)
            response = await shutdown.before_expiry(opening, self.drain.expired)
        except BaseException as exc:
            self.pool.release(up)
            if not isinstance(exc, shutdown.DrainExpiredError):
                raise
            ex.upstream = up
            return self._finish_error(ex, shutdown.shutting_down())
        ex.upstream = up
        if response.status_code != 200:
            try:
                content = await response.read()
            finally:
                response.close()
                self.pool.release(up)
            ex.status_code = response.status_code
            ex.outcome = "upstream_error" if response.status_code >= 500 else "client_error"
            self._log(ex)
            return Response(
                content,
                status_code=response.status_code,
                media_type=response.content_type,
                headers=ex.headers(),
            )
        return StreamingResponse(
            self._events(ex, up, response, client_usage),
            media_type="text/event-stream",
            headers={**ex.headers(), "Cache-Control": "no-cache"},
        )

    async def _events(
        self, ex: Exchange, up: Upstream, response: UpstreamStream, client_usage: bool
    ) -> AsyncIterator[bytes]:
        splitter = EventSplitter()
        sent_done = False  # the client has [DONE]: whatever happens next, the stream is complete
        try:
            async for data in shutdown.until_expired(response.chunks(), self.drain.expired):
                for event in splitter.feed(data):
                    if ex.ttft_s is None:
                        ex.ttft_s = time.perf_counter() - ex.started
                    usage, usage_only = usage_of(event)
                    if usage is not None:
                        ex.usage = usage
                        if usage_only and not client_usage:
                            continue
                    yield event
                    sent_done = sent_done or event.startswith(DONE[:-2])
            if not sent_done:  # an answer without [DONE] says nothing about the server's health
                ex.outcome, ex.status_code = "upstream_error", 502
                yield error_event("the model server ended the stream early; it is incomplete")
                yield DONE
        except shutdown.DrainExpiredError:  # shutting down: the client gets an end it can read
            if not sent_done:
                ex.outcome, ex.status_code = "unavailable", 503
                yield error_event("the router is shutting down; the answer is incomplete")
                yield DONE
        except TransportError as exc:  # the connection failed: out until its next health check
            if not sent_done:
                ex.outcome, ex.status_code = "upstream_error", 502
                if not isinstance(exc, AnswerTimeoutError):  # slow is not down
                    self.pool.mark_down(up)
                yield error_event(
                    "the model server failed while streaming; the answer is incomplete"
                )
                yield DONE
        except (asyncio.CancelledError, GeneratorExit):
            if not sent_done:
                ex.outcome, ex.status_code = "disconnected", 499
            raise
        finally:
            response.close()
            self.pool.release(up)
            self._log(ex)

    def _finish_error(
        self, ex: Exchange, response: Response, outcome: Outcome = "unavailable"
    ) -> Response:
        """Log and count a request that failed after it was routed; its answer says the
        route it took, as a successful one does."""
        ex.status_code = response.status_code
        ex.outcome = outcome
        self._log(ex)
        response.headers.update(ex.headers())
        return response

    async def _log_after(self, ex: Exchange) -> None:
        """`_log` as a background task: a coroutine, so Starlette runs it on the event loop
        instead of handing it to a worker thread (a thread hop costs more than the append)."""
        self._log(ex)

    def _log(self, ex: Exchange) -> None:
        """Count the request and append its query-log line."""
        r = ex.ctx.retrieval
        route, status = r.route, ex.outcome
        self.metrics.requests.labels(ex.endpoint, route, status).inc()
        self.metrics.prefix_requests.labels(ex.ctx.retrieval.prefix_id).inc()
        usage = Usage.of(ex.usage)
        if usage.prompt_tokens is not None:
            self.metrics.record_usage(route, usage.prompt_tokens, usage.cached_tokens, r.prefix_id)
            if ex.upstream is not None:
                self.keeper.observe(ex.upstream, ex.ctx.retrieval.prefix_id, usage)
            if ex.admission is not None:
                self.forensics.answered(ex.admission, usage, self.state.keep_warm.expected)
        if ex.ttft_s is not None and ex.outcome == "ok":
            self.metrics.ttft.labels(ex.endpoint, route).observe(ex.ttft_s)
        if ex.forward_s is not None:
            self.metrics.forward.observe(ex.forward_s)
        if self.log is None:
            return
        self.log.append(log_record(ex, usage))

    def reopen_log(self, trigger: str) -> None:
        """Reopen the query log at --log (logrotate's postrotate signal)."""
        if self.log is not None:
            self.log.reopen(trigger)

    def sync_log(self) -> None:
        """fsync the query log (called periodically and at shutdown)."""
        if self.log is not None:
            self.log.sync()

    def close(self) -> None:
        """Sync and close the query log."""
        if self.log is not None:
            self.log.close()
            self.log = None
