"""What the router refuses before it reads a body: requests from web pages (an `Origin` not let
in, a `Host` that is not this server's: DNS rebinding), bodies that are not JSON or are larger
than --max-body-bytes; the body read itself, bounded in bytes and in time; and the concurrency
budget (--max-concurrent), which a request draws on only once its whole body is in, so that
clients holding half-sent bodies cannot crowd out the others.

A page the local user opens can POST to a loopback router without a CORS preflight only with a
"simple" content type (text/plain, form data): requiring application/json, refusing a foreign
`Origin` and checking `Host` each close that door.
"""

from __future__ import annotations

import anyio
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from residency.serve.settings import RequestLimits, ServeSettings, is_loopback
from residency.serve.validation import RequestError
from residency.vllm_client import endpoints

GENERATION_PATHS = frozenset(endpoints.GENERATION_PATHS.values())
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


class ClientGoneError(Exception):
    """The client disconnected before its body was complete."""


class Slots:
    """The --max-concurrent budget: generation requests in flight, each counting as many
    completions as it asks for (n, best_of). Taken once a request's body is in and parsed,
    held until the last byte of its answer is sent (`RequestGuard` gives it back)."""

    def __init__(self, max_concurrent: int) -> None:
        self.max_concurrent = max_concurrent
        self.in_flight = 0

    def take(self, scope: Scope, weight: int) -> None:
        """Hold `weight` slots for this request, or raise a 429. A request asking for more
        than the whole budget is let in alone, when nothing else is in flight."""
        if self.in_flight and self.in_flight + weight > self.max_concurrent:
            ask = f"; this one asks for {weight}" if weight > 1 else ""
            raise RequestError(
                429,
                f"{self.in_flight} completions in flight of the {self.max_concurrent} "
                f"--max-concurrent allows{ask}; retry shortly",
                "too_many_concurrent_requests",
            )
        self.in_flight += weight
        scope[_SLOTS_KEY] = scope.get(_SLOTS_KEY, 0) + weight

    def release(self, scope: Scope) -> None:
        """Give back what this request holds (nothing when it was refused earlier)."""
        self.in_flight -= scope.pop(_SLOTS_KEY, 0)


_SLOTS_KEY = "residency.slots"  # in the ASGI scope: the slots the request holds


class RequestGuard:
    """ASGI middleware: Host, Origin, content type and declared size checks; gives back the
    slots a generation request took (`Slots`) when its answer is done."""

    def __init__(self, app: ASGIApp, settings: ServeSettings, slots: Slots) -> None:
        self.app = app
        self.limits = settings.limits
        self.origins = frozenset(o.rstrip("/") for o in settings.allow_origins)
        self.hosts = allowed_hosts(settings.host, settings.allow_hosts)
        self.slots = slots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            await refusal.response()(scope, receive, send)
            return
        if scope["path"] not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        try:  # the router takes slots once the body is in; held to the last byte sent
            await self.app(scope, receive, send)
        finally:
            self.slots.release(scope)

    def refusal(self, scope: Scope) -> RequestError | None:
        """Why this request is refused, or None."""
        headers = Headers(scope=scope)
        if len(headers.getlist("host")) > 1:  # RFC 9112 section 3.2: a 400, not the first
            return RequestError(400, "more than one Host header", "invalid_request_error")
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):  # a gzip body read as plain JSON would be garbage
            return RequestError(
                415,
                f"Content-Encoding {encoding!r}: send the body uncompressed (identity)",
                "unsupported_media_type",
            )
        host = headers.get("host")
        if self.hosts is not None and host is not None and host_name(host) not in self.hosts:
            return RequestError(
                403,
                f"Host {host!r} is not this server's; pass --allow-host to accept it",
                "host_not_allowed",
            )
        origin = headers.get("origin")
        if origin is not None and origin.rstrip("/") not in self.origins:
            return RequestError(
                403,
                f"requests from web pages (Origin {origin!r}) are refused; pass --allow-origin "
                "to let a page in",
                "origin_not_allowed",
            )
        if scope["method"] != "POST":
            return None
        media_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            return RequestError(
                415,
                f"Content-Type {media_type or 'missing'}: send application/json",
                "unsupported_media_type",
            )
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.limits.max_body_bytes:
            return _too_large(self.limits)
        return None


def allowed_hosts(bound: str, extra: tuple[str, ...]) -> frozenset[str] | None:
    """Host names the router answers to; None (any) when bound to every interface, where
    --api-key is required anyway."""
    name = bound.strip("[]").lower()
    if name in WILDCARD_HOSTS:
        return None
    names = {name, *(h.strip("[]").lower() for h in extra)}
    if is_loopback(bound):
        names |= LOOPBACK_NAMES
    return frozenset(names)


def host_name(host: str) -> str:
    """'127.0.0.1:8100' -> '127.0.0.1'; '[::1]:8100' -> '::1'; 'Example.COM' -> 'example.com'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


async def read_body(request: Request, limits: RequestLimits) -> bytes:
    """The whole body, at most --max-body-bytes, within --body-timeout."""
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(limits.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise _too_large(limits)
                chunks.append(chunk)
    except TimeoutError:
        raise RequestError(
            408,
            f"the request body did not arrive within --body-timeout {limits.body_timeout_s:g} s",
            "body_timeout",
            close=True,
        ) from None
    except ClientDisconnect:
        raise ClientGoneError from None
    return b"".join(chunks)


def _too_large(limits: RequestLimits) -> RequestError:
    """413, and the connection closed: the rest of the body is not read (nor discarded)."""
    return RequestError(
        413,
        f"the request body is larger than --max-body-bytes {limits.max_body_bytes}",
        "body_too_large",
        close=True,
    )


async def wait_disconnect(request: Request) -> None:
    """Return when the client goes away (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
