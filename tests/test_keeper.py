"""The residency keeper: one object the router speaks to, with the token count as its source on
an upstream that publishes no KV events (the KV-event source: tests/test_kv_events_vllm.py)."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest

from residency.keep.keeper import ResidencyKeeper
from residency.keep.token_count import KeepWarmPolicy
from residency.keep.upstream import KeepSettings
from residency.launcher import free_port
from residency.planning.plan_model import ResidencyPlan
from residency.serve.forensics import Forensics
from residency.serve.telemetry import RouterMetrics
from residency.serve.upstreams import UpstreamPool
from residency.vllm_client import Usage, open_session

POLICY = KeepWarmPolicy(
    hashes={"p0": "h0", "p1": "h1"},
    texts={"p0": "zero", "p1": "one"},
    expected={"p0": 96, "p1": 64},
    threshold_tokens=250,
)
SETTINGS = KeepSettings(
    warm_on_join=False,
    kv_events="off",
    kv_event_max_bytes=1 << 20,
    rewarm_interval_s=1.0,
    rewarm_wait_s=1.0,
    request_timeout_s=5.0,
    upstream_api_key=None,
)


def _no_plan() -> ResidencyPlan:
    raise AssertionError("the token-count source never reads the plan")


def _sample(metrics: RouterMetrics, line_start: str) -> float:
    text = generate_latest(metrics.registry).decode()
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(line_start))


def test_without_kv_events_the_keeper_counts_tokens_and_touches_what_is_due() -> None:
    asyncio.run(_token_count())


async def _token_count() -> None:
    async with open_session(5.0) as http:
        metrics = RouterMetrics()
        keeper = ResidencyKeeper(
            SETTINGS, metrics, _no_plan, lambda: POLICY, Forensics(metrics.agent)
        )
        # Nothing listens on this port: the touch is sent for real and fails.
        pool = UpstreamPool([f"http://127.0.0.1:{free_port()}"], http, metrics, 5.0, keeper.join)
        up = pool.upstreams[0]
        assert await keeper.join(up) is True  # --kv-events off, --no-warm: in rotation, cold
        assert _sample(metrics, 'residency_router_kv_events_mode{upstream="0"}') == 0
        assert keeper.index(up) is None  # no block index without events
        up.healthy, up.model = True, "m"
        await keeper.ready(up, "p0")  # no re-warm waiting: returns at once
        usage = Usage(prompt_tokens=300, cached_tokens=32, completion_tokens=4)
        keeper.observe(up, "p0", usage)  # 32 of 96 cached: an eviction; p1 aged 272 >= 250
        keeper.observe(up, "p0", usage)  # p1's touch is in flight: not sent twice
        await keeper.settle()
        assert _sample(metrics, 'residency_router_prefix_evictions_total{prefix="p0"}') == 2
        failed = 'residency_router_keep_warm_touches_total{prefix="p1",result="failed"}'
        assert _sample(metrics, failed) == 1
        assert keeper.count.age(up, "p0") == 0
        keeper.warmed(up)  # warmed again (a reload): every prefix young
        assert keeper.count.age(up, "p1") == 0
        await keeper.stop()
