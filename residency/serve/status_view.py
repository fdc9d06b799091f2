"""The residency picture of a running router (`GET /residency`) and the readiness it implies
(`GET /ready`): every planned prefix on every upstream, from vLLM's KV events where the upstream
publishes them and from the requests' usage (keep-warm's token count) elsewhere."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from residency.keep.block_index import BlockIndex
from residency.serve.forensics import RECENT_REQUESTS, Forensics
from residency.serve.upstreams import Upstream
from residency.status.model import (
    Mode,
    PrefixStatus,
    ResidencyStatus,
    State,
    UpstreamStatus,
)


class EngineView(Protocol):
    """Residency from KV events, per upstream (the router's EngineResidency, or
    `residency status` subscribed to a server itself)."""

    def active(self, up: Upstream) -> bool: ...
    def index(self, up: Upstream) -> BlockIndex | None: ...
    def rewarming(self, up: Upstream, prefix_id: str) -> bool: ...


def residency_status(
    plan_sha256: str,
    prefix_ids: Sequence[str],
    upstreams: Sequence[Upstream],
    engine: EngineView | None,
    forensics: Forensics,
    last: int = RECENT_REQUESTS,
) -> ResidencyStatus:
    """Upstream x prefix now; ready when each prefix is resident on a healthy upstream."""
    rows: list[PrefixStatus] = []
    ups: list[UpstreamStatus] = []
    resident_somewhere: set[str] = set()
    for up in upstreams:
        events = engine is not None and engine.active(up)
        mode: Mode = "events" if events else "token_count"
        evictions = sum(1 for e in forensics.evictions if e.upstream == up.label)
        ups.append(
            UpstreamStatus(upstream=up.label, healthy=up.usable, mode=mode, evictions=evictions)
        )
        for prefix in prefix_ids:
            row = _row(up, prefix, mode, engine, forensics, last)
            rows.append(row)
            if up.usable and row.state == "resident":
                resident_somewhere.add(prefix)
    missing = [p for p in prefix_ids if p not in resident_somewhere]
    return ResidencyStatus(
        plan_sha256=plan_sha256,
        recent_requests=last,
        ready=not missing,
        missing=missing,
        upstreams=ups,
        prefixes=rows,
        evictions=[e.record() for e in forensics.evictions],
    )


def _row(
    up: Upstream,
    prefix: str,
    mode: Mode,
    engine: EngineView | None,
    forensics: Forensics,
    last: int,
) -> PrefixStatus:
    record = forensics.prefix(up.label, prefix)
    recent = list(record.recent)[-last:]
    hits = sum(recent)
    resident: int | None = None
    total: int | None = None
    state: State
    index = engine.index(up) if engine is not None and mode == "events" else None
    if index is not None and prefix in index.prefix_ids:
        resident, total = index.resident_blocks(prefix), index.total_blocks(prefix)
        if total and resident == total:
            state = "resident"
        elif engine is not None and engine.rewarming(up, prefix):
            state = "warming"
        elif resident:
            state = "partial"
        else:
            state = "evicted"
    else:  # token count: what the prefix's last request found (warm proved it cached first)
        state = "evicted" if recent and not recent[-1] else "resident"
        if not up.usable:
            state = "evicted"
    return PrefixStatus(
        upstream=up.label,
        prefix=prefix,
        mode=mode,
        resident_blocks=resident,
        total_blocks=total,
        state=state,
        hits=hits,
        misses=len(recent) - hits,
        rewarms=record.rewarms,
        last_eviction=record.last.record() if record.last is not None else None,
    )
