"""The router's Prometheus metrics (own registry, served at /metrics).

Upstreams are labelled by their position in --upstream (0, 1, ...), never by address.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from residency.keep.agent_metrics import AgentMetrics

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_RETRIEVAL_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class RouterMetrics:
    """Counters and histograms for requests, TTFT, retrieval and upstream prefix-cache hits."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._declare_requests(r)
        self._declare_upstreams(r)
        self._declare_service(r)
        self.agent = AgentMetrics(r)
        for result in ("ok", "refused"):  # both series from the start, at 0
            self.plan_reloads.labels(result)
        for reason in ("SIGHUP", "SIGUSR1", "replaced", "vanished"):
            self.query_log_reopens.labels(reason)
        self._plan_sha256: str | None = None
        self._prompt_total = 0
        self._cached_total = 0

    def _declare_requests(self, r: CollectorRegistry) -> None:
        """Requests, their latencies and the keep-warm counts."""
        self.requests = Counter(
            "residency_router_requests",
            "Requests by endpoint, route and outcome.",
            ("endpoint", "route", "status"),
            registry=r,
        )
        self.prefix_requests = Counter(
            "residency_router_prefix_requests",
            "Requests by the resident prefix they went out with (plan.json prefix id).",
            ("prefix",),
            registry=r,
        )
        self.prefix_evictions = Counter(
            "residency_router_prefix_evictions",
            "Requests whose usage showed fewer cached tokens than their prefix minus one block.",
            ("prefix",),
            registry=r,
        )
        self.keep_warm_touches = Counter(
            "residency_router_keep_warm_touches",
            "Touches sent to keep an idle prefix cached: cached (found whole), evicted (found "
            "short, prefilled again) or failed.",
            ("prefix", "result"),
            registry=r,
        )
        self.ttft = Histogram(
            "residency_router_time_to_first_token_seconds",
            "Request arrival to the first streamed event (streams) or the whole answer.",
            ("endpoint", "route"),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.retrieval = Histogram(
            "residency_router_retrieval_seconds",
            "Retrieval, routing and time-expression handling per request.",
            buckets=_RETRIEVAL_BUCKETS,
            registry=r,
        )
        self.forward = Histogram(
            "residency_router_forward_seconds",
            "Arrival to the request handed to the upstream (the router's own work).",
            buckets=_RETRIEVAL_BUCKETS,
            registry=r,
        )
        self.prune = Histogram(
            "residency_router_prune_seconds",
            "Listwise pruner calls.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.pruner_invalid = Counter(
            "residency_router_pruner_invalid",
            "Pruner answers that were invalid or failed (everything kept).",
            registry=r,
        )

    def _declare_upstreams(self, r: CollectorRegistry) -> None:
        """Prefix-cache hits and the upstreams' health."""
        self.prompt_tokens = Counter(
            "residency_router_prompt_tokens",
            "Prompt tokens reported by upstream usage.",
            ("route",),
            registry=r,
        )
        self.cached_tokens = Counter(
            "residency_router_cached_prompt_tokens",
            "Prompt tokens upstream served from its prefix cache (usage.prompt_tokens_details).",
            ("route",),
            registry=r,
        )
        self.hit_ratio = Gauge(
            "residency_router_prefix_cache_hit_ratio",
            "Cached / prompt tokens over all requests with usage since start.",
            registry=r,
        )
        self.upstream_healthy = Gauge(
            "residency_router_upstream_healthy",
            "1 when the upstream answers /health and is in rotation.",
            ("upstream",),
            registry=r,
        )
        self.upstream_outstanding = Gauge(
            "residency_router_upstream_outstanding_requests",
            "Requests in flight per upstream (the balancer's key).",
            ("upstream",),
            registry=r,
        )

    def _declare_service(self, r: CollectorRegistry) -> None:
        """Plan reloads, the query log, bodies and slots."""
        self.plan_reloads = Counter(
            "residency_router_plan_reloads",
            "plan.json reloads (SIGHUP or --watch-plan): ok (swapped) or refused (old plan kept).",
            ("result",),
            registry=r,
        )
        self.plan_info = Gauge(
            "residency_router_plan_info",
            "1 for the sha256 of the plan.json being served.",
            ("sha256",),
            registry=r,
        )
        self.query_log_lines = Counter(
            "residency_router_query_log_lines",
            "Lines appended to the query log (--log).",
            registry=r,
        )
        self.query_log_reopens = Counter(
            "residency_router_query_log_reopens",
            "Query log reopened: on a signal (SIGHUP, SIGUSR1), or because the file at --log "
            "was replaced (rotated) or vanished (renamed or deleted: a new one is created).",
            ("reason",),
            registry=r,
        )
        self.bodies_receiving = Gauge(
            "residency_router_bodies_receiving",
            "Generation requests whose body is being read (they hold no --max-concurrent slot "
            "yet).",
            registry=r,
        )
        self.slots_in_use = Gauge(
            "residency_router_slots_in_use",
            "--max-concurrent slots held: generation requests in flight, each counted n times "
            "for n (or best_of) completions.",
            registry=r,
        )

    def record_usage(
        self, route: str, prompt_tokens: int, cached_tokens: int | None, prefix: str | None = None
    ) -> None:
        """Count one request's usage and refresh the hit ratios (overall, its route's and, when
        given, its prefix's)."""
        if prefix is not None:
            self.agent.record_usage(prefix, route, prompt_tokens, cached_tokens)
        self.prompt_tokens.labels(route).inc(prompt_tokens)
        self._prompt_total += prompt_tokens
        if cached_tokens is not None:
            self.cached_tokens.labels(route).inc(cached_tokens)
            self._cached_total += cached_tokens
        if self._prompt_total:
            self.hit_ratio.set(self._cached_total / self._prompt_total)

    def set_plan(self, sha256: str) -> None:
        """Expose the plan being served (the previous one's sample is removed)."""
        if self._plan_sha256 is not None:
            self.plan_info.remove(self._plan_sha256)
        self.plan_info.labels(sha256).set(1)
        self._plan_sha256 = sha256
