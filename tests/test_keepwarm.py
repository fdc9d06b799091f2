"""Keep-warm's accounting (residency/keep/token_count.py) without a model server: how a prefix
ages, when it is due, what counts as an eviction, and that a touch nobody answers is counted
as failed and not retried at once. The touch that keeps a prefix cached is tested on vLLM in
test_keepwarm_vllm.py."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest

from residency.keep.token_count import KeepWarmPolicy, TokenCount, new_tokens
from residency.launcher import free_port
from residency.serve.telemetry import RouterMetrics
from residency.serve.upstreams import UpstreamPool
from residency.vllm_client import Usage, open_session


def _policy(threshold: int | None) -> KeepWarmPolicy:
    return KeepWarmPolicy(
        hashes={"p0": "h0", "p1": "h1", "p2": "h2"},
        texts={"p0": "zero", "p1": "one", "p2": "two"},
        expected={"p0": 96, "p1": 64, "p2": 64},
        threshold_tokens=threshold,
    )


def _sample(metrics: RouterMetrics, line_start: str) -> float:
    text = generate_latest(metrics.registry).decode()
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(line_start))


def test_new_tokens_are_the_uncached_prompt_and_the_output() -> None:
    assert new_tokens(Usage(prompt_tokens=500, cached_tokens=320, completion_tokens=7)) == 187
    assert new_tokens(Usage(prompt_tokens=500, cached_tokens=None, completion_tokens=None)) == 500
    # No cached tokens reported (vLLM without --enable-prompt-tokens-details): the prefix's own.
    no_details = Usage(prompt_tokens=500, cached_tokens=None, completion_tokens=2)
    assert new_tokens(no_details, assumed_cached=384) == 118


def test_ages_evictions_and_no_touch_without_a_threshold() -> None:
    asyncio.run(_ages())


async def _ages() -> None:
    async with open_session(5.0) as http:
        metrics = RouterMetrics()
        up = UpstreamPool(["http://127.0.0.1:9"], http, metrics, 5.0).upstreams[0]
        up.healthy, up.model = True, "m"
        keep = TokenCount(metrics, lambda: _policy(None))
        keep.observe(up, "p0", Usage(prompt_tokens=300, cached_tokens=96, completion_tokens=4))
        assert (keep.age(up, "p0"), keep.age(up, "p1"), keep.age(up, "p2")) == (0, 208, 208)
        keep.observe(up, "p1", Usage(prompt_tokens=200, cached_tokens=32, completion_tokens=0))
        assert (keep.age(up, "p0"), keep.age(up, "p1"), keep.age(up, "p2")) == (168, 0, 376)
        assert keep.age(up, "p9") is None  # not in the plan being served
        keep.warmed(up)  # it re-joined and was warmed: every prefix young again
        assert (keep.age(up, "p0"), keep.age(up, "p1"), keep.age(up, "p2")) == (0, 0, 0)
        # p1 expected 64 cached and found 32: one eviction; p0's 96 of 96 is none.
        assert _sample(metrics, 'residency_router_prefix_evictions_total{prefix="p1"}') == 1
        assert _sample(metrics, 'residency_router_prefix_evictions_total{prefix="p0"}') == 0
        assert _sample(metrics, "residency_router_keep_warm_touches_total") == 0


def test_a_due_prefix_is_touched_once_and_a_failed_touch_waits_for_the_next_threshold() -> None:
    asyncio.run(_due())


async def _due() -> None:
    async with open_session(5.0) as http:
        metrics = RouterMetrics()
        # Nothing listens on this port: the touch is sent for real and fails.
        up = UpstreamPool([f"http://127.0.0.1:{free_port()}"], http, metrics, 5.0).upstreams[0]
        up.healthy, up.model = True, "m"
        keep = TokenCount(metrics, lambda: _policy(250))
        keep.observe(up, "p0", Usage(prompt_tokens=200, cached_tokens=96, completion_tokens=4))
        assert _sample(metrics, "residency_router_keep_warm_touches_total") == 0  # 108 < 250
        keep.observe(up, "p0", Usage(prompt_tokens=300, cached_tokens=96, completion_tokens=4))
        keep.observe(up, "p0", Usage(prompt_tokens=300, cached_tokens=96, completion_tokens=4))
        await keep.settle()
        failed = 'residency_router_keep_warm_touches_total{prefix="p1",result="failed"}'
        assert _sample(metrics, failed) == 1  # due at 316, not sent again while in flight
        assert _sample(metrics, 'residency_router_keep_warm_touches_total{prefix="p0"') == 0
        assert keep.age(up, "p1") == 0  # a failed touch is not retried on the next request
        up.healthy = False
        for _ in range(3):
            keep.observe(up, "p0", Usage(prompt_tokens=300, cached_tokens=96, completion_tokens=4))
        await keep.settle()
        assert _sample(metrics, failed) == 1  # no touches to an upstream out of rotation


def test_a_reloaded_plan_ages_only_its_own_prefixes() -> None:
    asyncio.run(_reload())


async def _reload() -> None:
    async with open_session(5.0) as http:
        metrics = RouterMetrics()
        up = UpstreamPool(["http://127.0.0.1:9"], http, metrics, 5.0).upstreams[0]
        up.healthy, up.model = True, "m"
        served = [_policy(None)]
        keep = TokenCount(metrics, lambda: served[0])
        keep.observe(up, "p0", Usage(prompt_tokens=300, cached_tokens=96, completion_tokens=4))
        assert keep.age(up, "p1") == 208
        # The new plan keeps p1's text (same hash) under the id p0 and has a new prefix p1.
        served[0] = KeepWarmPolicy(
            hashes={"p0": "h1", "p1": "h9"},
            texts={"p0": "one", "p1": "new"},
            expected={"p0": 64, "p1": 64},
            threshold_tokens=None,
        )
        keep.observe(up, "p1", Usage(prompt_tokens=100, cached_tokens=64, completion_tokens=0))
        assert (keep.age(up, "p0"), keep.age(up, "p1")) == (244, 0)  # h1 kept its age
