"""The router's response headers: which route a request took and which sections it retrieved
(ids only, never addresses), written by the router and read by its clients (eval, demo)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence

ROUTE_HEADER = "X-Residency-Route"
RETRIEVED_HEADER = "X-Residency-Retrieved"


def route_headers(route: str, section_ids: Sequence[str]) -> dict[str, str]:
    """Both headers: the route, and the section ids comma-separated, each percent-encoded."""
    retrieved = ",".join(urllib.parse.quote(s, safe="") for s in section_ids)
    return {ROUTE_HEADER: route, RETRIEVED_HEADER: retrieved}


def parse_retrieved_header(value: str | None) -> tuple[str, ...]:
    """Section ids of `X-Residency-Retrieved`: comma-separated, each percent-encoded."""
    if not value:
        return ()
    return tuple(urllib.parse.unquote(part) for part in value.split(",") if part.strip())


def read_route_headers(headers: Mapping[str, str]) -> tuple[str | None, tuple[str, ...]]:
    """(route, retrieved section ids) of a router answer (lower-case header names, as httpx
    gives them); (None, ()) for an answer that did not come through the router."""
    route = headers.get(ROUTE_HEADER.lower()) or None
    return route, parse_retrieved_header(headers.get(RETRIEVED_HEADER.lower()))
