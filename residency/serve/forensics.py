"""What the router saw around each eviction of a planned block, and each prefix's recent
requests: the evidence `GET /residency` and `residency status` show.

An eviction (from vLLM's KV events, residency/keep/kv_residency.py) is recorded with its time,
upstream, prefix and blocks lost, the requests the router had handed to that upstream in the
preceding second (their uncached tokens, read from their usage once they finish: a request
still being prefilled when the block went is the likely cause and has no usage yet) and vLLM's
`vllm:kv_cache_usage_perc` read from the upstream's /metrics right after. vLLM counts cached
blocks nobody uses as free (they are evictable), so a pool full of idle warm prefixes reads
near 0 %: a high reading at an eviction means requests in flight held the pool. An eviction
with no router request before it came from traffic past the router.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from residency.keep.agent_metrics import AgentMetrics
from residency.keep.upstream import KeptUpstream
from residency.status.model import AdmittedRequest, EvictionRecord
from residency.vllm_client import TransportError, Usage, find_samples, parse_prometheus

log = logging.getLogger("residency.serve")

WINDOW_S = 1.0  # requests admitted this long before an eviction are reported with it
RECENT_REQUESTS = 100  # per upstream and prefix: the hits and misses `status` shows
EVICTIONS_KEPT = 200  # the newest evictions kept for /residency
ADMISSIONS_KEPT = 4096  # admitted requests kept to look back from an eviction
USAGE_METRIC = "vllm:kv_cache_usage_perc"
USAGE_TIMEOUT_S = 2.0


@dataclass(slots=True)
class Admission:
    """One request the router handed to an upstream; its usage filled in when it finishes."""

    at: float  # time.monotonic() when it was handed over
    upstream: str
    prefix: str | None
    route: str
    prompt_tokens: int | None = None
    cached_tokens: int | None = None


@dataclass(slots=True)
class Eviction:
    """One eviction as seen; the admissions' usage and the pool usage arrive later."""

    at: float  # time.monotonic()
    at_unix_s: float
    engine_at_unix_s: float
    upstream: str
    prefix: str
    blocks_lost: int
    resident_blocks: int
    total_blocks: int
    admitted: list[Admission]
    kv_cache_usage_perc: float | None = None

    def record(self) -> EvictionRecord:
        """As `GET /residency` shows it."""
        return EvictionRecord(
            at_unix_s=self.at_unix_s,
            engine_at_unix_s=self.engine_at_unix_s,
            upstream=self.upstream,
            prefix=self.prefix,
            blocks_lost=self.blocks_lost,
            resident_blocks=self.resident_blocks,
            total_blocks=self.total_blocks,
            kv_cache_usage_perc=self.kv_cache_usage_perc,
            admitted=[
                AdmittedRequest(
                    before_s=round(max(self.at - a.at, 0.0), 3),
                    prefix=a.prefix,
                    route=a.route,
                    prompt_tokens=a.prompt_tokens,
                    uncached_tokens=_uncached(a),
                )
                for a in self.admitted
            ],
        )


@dataclass(slots=True)
class _Prefix:
    """One upstream x prefix: recent request outcomes (True: found the prefix cached)."""

    recent: deque[bool] = field(default_factory=lambda: deque(maxlen=RECENT_REQUESTS))
    rewarms: int = 0
    resident: int = 0
    total: int = 0
    last: Eviction | None = None


class Forensics:
    """The router's memory of admissions, request outcomes, evictions and re-warms."""

    def __init__(self, metrics: AgentMetrics) -> None:
        self._metrics = metrics
        self._admissions: deque[Admission] = deque(maxlen=ADMISSIONS_KEPT)
        self._prefixes: dict[tuple[str, str], _Prefix] = {}
        self.evictions: deque[Eviction] = deque(maxlen=EVICTIONS_KEPT)
        self._tasks: set[asyncio.Task[None]] = set()

    def admitted(self, upstream: str, prefix: str | None, route: str) -> Admission:
        """A request handed to `upstream` now."""
        a = Admission(time.monotonic(), upstream, prefix, route)
        self._admissions.append(a)
        return a

    def answered(self, a: Admission, usage: Usage, expected: Mapping[str, int]) -> None:
        """Its usage; a hit when it found at least its prefix's `expected` tokens (the prefix
        less a block) cached."""
        a.prompt_tokens, a.cached_tokens = usage.prompt_tokens, usage.cached_tokens
        least = expected.get(a.prefix) if a.prefix is not None else None
        if a.prefix is None or a.prompt_tokens is None or least is None:
            return
        self.prefix(a.upstream, a.prefix).recent.append((a.cached_tokens or 0) >= least)

    def prefix(self, upstream: str, prefix: str) -> _Prefix:
        """The record of one upstream x prefix (created empty)."""
        key = (upstream, prefix)
        if key not in self._prefixes:
            self._prefixes[key] = _Prefix()
        return self._prefixes[key]

    # The KV-event hooks (EngineResidency.observer).

    def published(self, upstream: str, prefix: str, resident: int, total: int) -> None:
        """The prefix's resident and total blocks after a batch."""
        p = self.prefix(upstream, prefix)
        p.resident, p.total = resident, total

    def rewarmed(self, upstream: str, prefix: str, reason: str, result: str) -> None:
        """A re-warm of the prefix finished (refresh touches and learning probes excluded)."""
        if result == "ok" and reason in ("evicted", "cleared", "restart"):
            self.prefix(upstream, prefix).rewarms += 1

    def evicted(
        self, up: KeptUpstream, prefix: str, resident: int, total: int, engine_ts: float
    ) -> None:
        """Blocks of a planned prefix were evicted on `up` (published at `engine_ts`): record
        it, count the blocks, and read vLLM's pool usage (logged with the record once read).
        A prefix whole again by the batch's end (a block stored again in it) is no loss."""
        now = time.monotonic()
        p = self.prefix(up.label, prefix)
        if resident >= total:
            p.resident, p.total = resident, total
            return
        # at least one: blocks stored and removed in one batch leave fewer lost than taken
        lost = max(p.resident - resident, 1)
        admitted = [
            a for a in self._admissions if a.upstream == up.label and now - a.at <= WINDOW_S
        ]
        e = Eviction(now, time.time(), engine_ts, up.label, prefix, lost, resident, total, admitted)
        p.resident, p.total, p.last = resident, total, e
        self.evictions.append(e)
        self._metrics.blocks_evicted.labels(up.label, prefix).inc(lost)
        task = asyncio.get_running_loop().create_task(self._read_usage(up, e))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read_usage(self, up: KeptUpstream, e: Eviction) -> None:
        """vLLM's pool usage now, then the log line (the admissions' usage known so far)."""
        try:
            text = await up.client.metrics_text(timeout_s=USAGE_TIMEOUT_S)
            found = find_samples(parse_prometheus(text), USAGE_METRIC)
            e.kv_cache_usage_perc = max(s.value for s in found) if found else None
        except (TransportError, ValueError):
            pass
        usage = "?" if e.kv_cache_usage_perc is None else f"{e.kv_cache_usage_perc:.0%}"
        routed = (
            ", ".join(f"{a.route} {a.prefix or '-'} {_tokens(a)}" for a in e.admitted)
            or "none (traffic past the router)"
        )
        log.info(
            "eviction on upstream %s: prefix %s lost %d block(s), %d of %d resident; KV cache "
            "usage %s; router requests in the preceding %.0f s: %s",
            *(e.upstream, e.prefix, e.blocks_lost, e.resident_blocks, e.total_blocks),
            *(usage, WINDOW_S, routed),
        )

    async def stop(self) -> None:
        """Cancel the pool-usage reads in flight (at shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _uncached(a: Admission) -> int | None:
    if a.prompt_tokens is None:
        return None
    return max(a.prompt_tokens - (a.cached_tokens or 0), 0)


def _tokens(a: Admission) -> str:
    n = _uncached(a)
    return "in flight" if n is None else f"{n} uncached tokens"
