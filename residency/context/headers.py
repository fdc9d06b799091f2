"""The router's response headers: which route a request took and which sections it retrieved
(ids only, never addresses), written by the router and read by its clients (eval, demo)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence

ROUTE_HEADER = "X-Residency-Route"
RETRIEVED_HEADER = "X-Residency-Retrieved"
PREFIX_HEADER = "X-Residency-Prefix"


def route_headers(
    route: str, section_ids: Sequence[str], prefix_id: str | None = None
) -> dict[str, str]:
    """The route, the section ids comma-separated (each percent-encoded), and the resident
    prefix the request went out with."""
    retrieved = ",".join(urllib.parse.quote(s, safe="") for s in section_ids)
    out = {ROUTE_HEADER: route, RETRIEVED_HEADER: retrieved}
    if prefix_id is not None:
        out[PREFIX_HEADER] = urllib.parse.quote(prefix_id, safe="")
    return out


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
