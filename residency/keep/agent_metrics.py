"""The agent's Prometheus metrics, in the router's registry: prefix residency from KV events,
re-warms, hit rates per prefix and route, re-planning and the recall canary.

Every family is declared at start (the dashboard and alert rules in deploy/ query them by name;
tests/test_deploy.py checks each name against a live router's /metrics).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge

RECALL_KS = (1, 3, 5, 10)


class AgentMetrics:
    """Gauges and counters of the agent loops (labels: upstream position, plan prefix id)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self._declare_residency(r)
        self._declare_hits(r)
        self._declare_replan(r)
        self._declare_canary(r)
        self._set_mtime: float | None = None
        self.canary_age.set_function(self._age)
        self._tokens: dict[tuple[str, str], list[int]] = {}

    def _declare_residency(self, r: CollectorRegistry) -> None:
        """Prefix residency from KV events, re-warms and keep-warm requests."""
        self.kv_events = Gauge(
            "residency_router_kv_events_mode",
            "1 when residency comes from the upstream's KV events, 0 when keep-warm counts "
            "tokens (no events published, or --kv-events off).",
            ("upstream",),
            registry=r,
        )
        self.event_batches = Counter(
            "residency_router_kv_event_batches",
            "KV event batches read from the upstream (replayed ones included).",
            ("upstream",),
            registry=r,
        )
        self.kv_event_errors = Counter(
            "residency_router_kv_event_errors",
            "KV event messages skipped as malformed, by kind (msgpack, layout, ts, event, "
            "field, frames, seq, size, apply, replay, internal).",
            ("upstream", "kind"),
            registry=r,
        )
        self.kv_event_hashes = Gauge(
            "residency_router_kv_event_hashes",
            "Block hashes the router's index of the upstream's cache holds (bounded).",
            ("upstream",),
            registry=r,
        )
        self.resident_blocks = Gauge(
            "residency_router_prefix_resident_blocks",
            "Leading blocks of the prefix the upstream holds, from its KV events.",
            ("upstream", "prefix"),
            registry=r,
        )
        self.chain_blocks = Gauge(
            "residency_router_prefix_blocks",
            "Cacheable blocks of the prefix (full blocks before its last token).",
            ("upstream", "prefix"),
            registry=r,
        )
        self.block_evictions = Counter(
            "residency_router_prefix_block_evictions",
            "Event batches in which the upstream evicted resident blocks of the prefix "
            "(BlockRemoved, AllBlocksCleared).",
            ("upstream", "prefix"),
            registry=r,
        )
        self.blocks_evicted = Counter(
            "residency_router_prefix_blocks_evicted",
            "Resident blocks of the prefix the upstream evicted (each eviction is also logged and "
            "listed at GET /residency with the router's requests admitted just before it).",
            ("upstream", "prefix"),
            registry=r,
        )
        self._declare_rewarms(r)

    def _declare_rewarms(self, r: CollectorRegistry) -> None:
        """Re-warms and the keep-warm requests of both sources."""
        self.rewarms = Counter(
            "residency_router_prefix_rewarms",
            "Re-warms sent from KV events: reason evicted, cleared, restart or learn (the "
            "prefix's blocks not yet seen); result ok or failed.",
            ("upstream", "prefix", "reason", "result"),
            registry=r,
        )
        self.keep_warm_requests = Counter(
            "residency_router_keep_warm_requests",
            "Requests the router sent to keep prefixes cached: mode touch (keep-warm's token "
            "count, one prefix each) or rewarm (KV events, every prefix due in one request).",
            ("upstream", "mode"),
            registry=r,
        )
        self.keep_warm_prefill_tokens = Counter(
            "residency_router_keep_warm_prefill_tokens",
            "Prompt tokens those requests made the upstream prefill: prompt minus cached "
            "tokens of a touch's usage; for a re-warm, its prompts' tokens past their "
            "resident blocks in the KV-event block index when it was sent.",
            ("upstream", "mode"),
            registry=r,
        )

    def _declare_hits(self, r: CollectorRegistry) -> None:
        """Prefix-cache hits per prefix and route."""
        self.prefix_prompt_tokens = Counter(
            "residency_router_prefix_prompt_tokens",
            "Prompt tokens of the requests that went out with the prefix.",
            ("prefix",),
            registry=r,
        )
        self.prefix_cached_tokens = Counter(
            "residency_router_prefix_cached_tokens",
            "Of those, tokens the upstream served from its prefix cache.",
            ("prefix",),
            registry=r,
        )
        self.prefix_hit_ratio = Gauge(
            "residency_router_prefix_hit_ratio",
            "Cached / prompt tokens of the prefix's requests since the router started.",
            ("prefix",),
            registry=r,
        )
        self.route_hit_ratio = Gauge(
            "residency_router_route_hit_ratio",
            "Cached / prompt tokens per route since the router started.",
            ("route",),
            registry=r,
        )

    def _declare_replan(self, r: CollectorRegistry) -> None:
        """Re-planning."""
        self.replans = Counter(
            "residency_router_replans",
            "Re-plans from the query log: swapped, kept (gain within --replan-margin), "
            "refused (the swap failed) or failed (no plan could be made).",
            ("decision",),
            registry=r,
        )
        self.replan_coverage = Gauge(
            "residency_router_replan_coverage",
            "Share of the last re-plan window's questions whose top chunk is resident: the "
            "plan served then (current) and the one made from the window (candidate).",
            ("plan",),
            registry=r,
        )
        self.replan_window = Gauge(
            "residency_router_replan_window_questions",
            "Questions in the last re-plan window.",
            registry=r,
        )

    def _declare_canary(self, r: CollectorRegistry) -> None:
        """The recall canary."""
        self.recall = Gauge(
            "residency_recall_at_k",
            "Canary recall@k of the live retriever over the labelled set.",
            ("k",),
            registry=r,
        )
        self.mrr = Gauge("residency_recall_mrr_at_10", "Canary MRR@10.", registry=r)
        self.recall_ok = Gauge(
            "residency_recall_ok",
            "1 while the canary's --min-recall metric is at or above its floor, else 0.",
            registry=r,
        )
        self.recall_floor = Gauge(
            "residency_recall_floor", "The --min-recall floor the canary checks.", registry=r
        )
        self.canary_questions = Gauge(
            "residency_recall_set_questions",
            "Labelled questions the canary evaluates (those with gold ids).",
            registry=r,
        )
        self.canary_age = Gauge(
            "residency_recall_set_age_seconds",
            "Seconds since the labelled set's file was last written.",
            registry=r,
        )
        self.canary_last = Gauge(
            "residency_recall_last_run_timestamp_seconds",
            "Unix time the canary last finished.",
            registry=r,
        )
        self.canary_runs = Counter(
            "residency_recall_canary_runs",
            "Canary runs: trigger schedule, start, plan (a plan or index change) or set "
            "(the labelled file changed); failed ones under trigger failed.",
            ("trigger",),
            registry=r,
        )

    def set_canary_file_time(self, mtime: float) -> None:
        """The labelled set's modification time (its age is read at scrape time)."""
        self._set_mtime = mtime

    def _age(self) -> float:
        return 0.0 if self._set_mtime is None else max(time.time() - self._set_mtime, 0.0)

    def record_usage(self, prefix: str, route: str, prompt: int, cached: int | None) -> None:
        """Count one request's tokens by prefix, and refresh the prefix's and route's ratios."""
        self.prefix_prompt_tokens.labels(prefix).inc(prompt)
        if cached is not None:
            self.prefix_cached_tokens.labels(prefix).inc(cached)
        ratios = (("p", prefix, self.prefix_hit_ratio), ("r", route, self.route_hit_ratio))
        for kind, name, ratio in ratios:
            sums = self._tokens.setdefault((kind, name), [0, 0])
            sums[0] += prompt
            sums[1] += cached or 0
            if sums[0]:
                ratio.labels(name).set(sums[1] / sums[0])
