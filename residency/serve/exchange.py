"""One request's state from its arrival to its query-log line (the router's working record)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from residency.context.builder import RequestContext
from residency.context.headers import route_headers
from residency.serve.forensics import Admission
from residency.serve.record import Outcome
from residency.serve.upstreams import Upstream
from residency.vllm_client.endpoints import Generation

Endpoint = Generation


@dataclass(slots=True)
class Exchange:
    """One request's state from arrival to its log line."""

    endpoint: Endpoint
    ctx: RequestContext
    started: float  # perf_counter at arrival
    ts: dt.datetime  # wall clock at arrival (UTC)
    upstream: Upstream | None = None
    status_code: int = 200
    outcome: Outcome = "ok"
    usage: dict[str, Any] | None = None
    ttft_s: float | None = None
    forward_s: float | None = None  # arrival -> request handed to the upstream
    source: str | None = None  # who asked (record.source_of): re-planning caps each
    admission: Admission | None = None  # for eviction forensics (serve/forensics.py)

    def headers(self) -> dict[str, str]:
        """What the router tells the client about its choice (ids only, no addresses)."""
        r = self.ctx.retrieval
        return route_headers(r.route, self.ctx.section_ids, r.prefix_id)
