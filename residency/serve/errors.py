"""OpenAI-shaped error responses: `{"error": {"message", "type", "code"}}`, nothing internal."""

from __future__ import annotations

import orjson
from starlette.responses import Response


def error_response(
    status: int, message: str, kind: str, code: str | None = None, param: str | None = None
) -> Response:
    """A JSON error the OpenAI client libraries understand."""
    body = {"error": {"message": message, "type": kind, "code": code, "param": param}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def unavailable(configured: int) -> Response:
    """503: no upstream can take the request (positions only, never addresses)."""
    return error_response(
        503,
        f"no upstream model server is available ({configured} configured, 0 healthy); "
        "retry shortly",
        "service_unavailable",
        "upstream_unavailable",
    )
