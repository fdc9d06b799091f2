"""Every labelled series the dashboard and the alert rules query, created at 0 before the first
request: known upstreams, plan prefixes, routes, endpoints, outcomes, modes, reasons, results
and decisions.

Prometheus practice is to initialise the label sets a process knows of: a counter that does not
exist until its first event reads "No data" on a panel and keeps `increase()` / `rate()` alerts
from ever firing on its first increment (there is no earlier sample to compare with). A reloaded
plan's new prefixes are initialised as it is swapped in; the old ones keep their last values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

from residency.context.routing import Route
from residency.keep.agent_metrics import RECALL_KS
from residency.serve.record import Outcome
from residency.serve.telemetry import RouterMetrics
from residency.vllm_client.endpoints import Generation

REWARM_REASONS = ("evicted", "cleared", "restart", "learn", "refresh")
RESULTS = ("ok", "failed")
TOUCH_RESULTS = ("cached", "evicted", "failed")
KEEP_WARM_MODES = ("touch", "rewarm")
REPLAN_DECISIONS = ("swap", "keep", "refused", "failed")
REPLAN_PLANS = ("current", "candidate")


def initialise_series(
    metrics: RouterMetrics, upstreams: Sequence[str], prefix_ids: Sequence[str]
) -> None:
    """Create (at 0, or as they stand) every series of these upstream labels and prefix ids."""
    a = metrics.agent
    routes: tuple[str, ...] = get_args(Route)
    for endpoint in get_args(Generation):
        for route in routes:
            metrics.ttft.labels(endpoint, route)
            for outcome in get_args(Outcome):
                metrics.requests.labels(endpoint, route, outcome)
    for route in routes:
        metrics.prompt_tokens.labels(route)
        metrics.cached_tokens.labels(route)
        a.route_hit_ratio.labels(route)
    for prefix in prefix_ids:
        metrics.prefix_requests.labels(prefix)
        metrics.prefix_evictions.labels(prefix)
        for result in TOUCH_RESULTS:
            metrics.keep_warm_touches.labels(prefix, result)
        a.prefix_prompt_tokens.labels(prefix)
        a.prefix_cached_tokens.labels(prefix)
        a.prefix_hit_ratio.labels(prefix)
    for up in upstreams:
        metrics.upstream_healthy.labels(up)
        metrics.upstream_outstanding.labels(up)
        a.kv_events.labels(up)
        a.event_batches.labels(up)
        for mode in KEEP_WARM_MODES:
            a.keep_warm_requests.labels(up, mode)
            a.keep_warm_prefill_tokens.labels(up, mode)
        for prefix in prefix_ids:
            a.resident_blocks.labels(up, prefix)
            a.chain_blocks.labels(up, prefix)
            a.block_evictions.labels(up, prefix)
            a.blocks_evicted.labels(up, prefix)
            for reason in REWARM_REASONS:
                for result in RESULTS:
                    a.rewarms.labels(up, prefix, reason, result)
    for decision in REPLAN_DECISIONS:
        a.replans.labels(decision)
    for plan in REPLAN_PLANS:
        a.replan_coverage.labels(plan)
    for k in RECALL_KS:
        a.recall.labels(str(k))
