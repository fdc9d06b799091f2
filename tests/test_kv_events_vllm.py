"""Residency from vLLM's KV events on a real server: the tiny dense model on vLLM CPU with events
published over ZMQ and a small KV cache, so that a few requests sent to vLLM past the router evict
a planned prefix. With events the router sees the BlockRemoved, re-warms the prefix and the next
question finds it cached; with `--kv-events off` (keep-warm counting the tokens it routed, blind
to traffic past it) the same traffic leaves a question to find its prefix short. The replay that
counts both over many questions is a measurement: benchmarks/test_bench_kv_events.py."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from kv_events_traffic import (
    DIRECT_TOKENS,
    ask,
    direct,
    events_ready,
    filler_words,
    metric,
    questions,
    wait_for,
)
from router_server import RouterProcess
from vllm_server import VllmServer

from residency.planning.plan_model import read_plan

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def events_plan(kv_events_plan: Path) -> Path:
    """The English sample planned against that server (conftest, shared with keep-warm)."""
    return kv_events_plan


def test_an_evicted_prefix_is_rewarmed_from_the_events_and_found_cached(
    events_server: VllmServer, events_plan: Path, tmp_path: Path
) -> None:
    plan = read_plan(events_plan)
    prefixes = len(plan.all_prefixes())
    words = filler_words(events_server, DIRECT_TOKENS)
    httpx.post(f"{events_server.base_url}/reset_prefix_cache", timeout=60)
    with RouterProcess(
        events_plan,
        [events_server.base_url],
        tmp_path,
        ("--retriever", "bm25", "--rewarm-interval", "0.5"),
    ) as router:
        wait_for(lambda: events_ready(router, prefixes), "every prefix whole from the events")
        assert "residency from vLLM's KV events" in router.log_text()
        ask(router, questions(1)[0])
        evictions = metric(router, "residency_router_prefix_block_evictions_total")
        n = 0
        while metric(router, "residency_router_prefix_block_evictions_total") == evictions:
            assert n < 20, "20 requests past the router evicted no planned prefix"
            direct(events_server, n, words)
            n += 1
        wait_for(
            lambda: (
                metric(
                    router, "residency_router_prefix_rewarms_total", reason="evicted", result="ok"
                )
                >= 1
            ),
            "a re-warm after the eviction",
        )
        wait_for(lambda: events_ready(router, prefixes), "every prefix whole again")
        for question in questions(8):
            ask(router, question)
        assert metric(router, "residency_router_prefix_evictions_total") == 0
        assert metric(router, "residency_router_keep_warm_touches_total") == 0
        # One re-warm request carried several prefixes (the refill and the prefixes still
        # whole, touched beside it): fewer requests than prefixes re-warmed.
        requests = metric(router, "residency_router_keep_warm_requests_total", mode="rewarm")
        carried = metric(router, "residency_router_prefix_rewarms_total", result="ok")
        assert 1 <= requests < carried, (requests, carried)
        logged = router.log_text()
    assert re.search(r"prefix p\d+ lost blocks \(\d+ of \d+ resident, KV events\)", logged)

    # The heuristic, blind to the same traffic past the router: the question finds it short.
    httpx.post(f"{events_server.base_url}/reset_prefix_cache", timeout=60)
    args = ("--retriever", "bm25", "--kv-events", "off")
    with RouterProcess(events_plan, [events_server.base_url], tmp_path, args) as router:
        assert metric(router, "residency_router_kv_events_mode", upstream="0") == 0
        for m in range(n + 2):
            direct(events_server, 100 + m, words)
        for question in questions(8):
            ask(router, question)
        shorts = metric(router, "residency_router_prefix_evictions_total")
    assert shorts >= 1
