"""Residency from vLLM's KV events against keep-warm's token count, replayed on a real server
(issue 36): the tiny dense model on vLLM CPU with events over ZMQ and a 96-block cache, the
English sample planned against it, 24 questions each followed by other traffic larger than the
plan's headroom, a fixed think time between requests (the same arrival process in both modes).

Two kinds of traffic: sent to vLLM past the router (keep-warm cannot count it; events see the
evictions), or carried by the questions through the router (both see it). Reported per mode:
questions that found their prefix short, touches (heuristic) and re-warms (events), the
requests those took and the tokens they made vLLM prefill. Target: events leave fewer questions
short where traffic goes past the router, with fewer requests than the touches. A measurement
of timing on a shared machine (events arrive a step late; re-warms race the next question):
here, not in tests/ (tests/test_kv_events_vllm.py checks the behaviour once).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))  # the server harnesses live beside the tests
from kv_events_traffic import (  # noqa: E402
    BLOCK_SIZE,
    GAP_S,
    MAX_MODEL_LEN,
    REPLAY_QUESTIONS,
    events_ready,
    events_server_args,
    filler_words,
    plan_for_events,
    replay,
    wait_for,
)
from router_server import RouterProcess  # noqa: E402
from vllm_server import VllmServer  # noqa: E402

from residency.planning.plan_model import read_plan  # noqa: E402

SERVER_ARGS = ("--enforce-eager", "--enable-prompt-tokens-details", "--enable-prefix-caching")

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def events_server(
    model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("kv-events-server") / "vllm.log"
    server = VllmServer(
        model_dirs["dense"],
        max_model_len=MAX_MODEL_LEN,
        log_path=log,
        extra_args=events_server_args(SERVER_ARGS),
    ).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def events_plan(events_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return plan_for_events(events_server, tmp_path_factory.mktemp("kv-events"))


@pytest.mark.parametrize("traffic", ["past-router", "through-router"])
def test_replay_events_against_the_heuristic(
    events_server: VllmServer,
    events_plan: Path,
    tmp_path: Path,
    traffic: str,
    record_property: Callable[[str, object], None],
) -> None:
    plan = read_plan(events_plan)
    assert plan.arithmetic is not None
    # More than the plan's headroom: each request of other traffic evicts planned blocks too,
    # however young keep-warm's touches keep them.
    other = plan.arithmetic.headroom_tokens + 8 * BLOCK_SIZE
    if traffic == "through-router":  # the question carries it: within one request's window
        # (beside the prefix and up to --k retrieved passages)
        # (here: none left beside the largest prefix, so the questions alone)
        other = max(
            min(other, MAX_MODEL_LEN - max(p.tokens for p in plan.all_prefixes()) - 3500), 0
        )
    words = filler_words(events_server, other)
    figures: dict[str, dict[str, float]] = {}
    for mode in ("heuristic", "events"):
        httpx.post(f"{events_server.base_url}/reset_prefix_cache", timeout=60)
        args = ("--retriever", "bm25", "--rewarm-interval", "0.5")
        if mode == "heuristic":
            args = (*args, "--kv-events", "off")
        with RouterProcess(events_plan, [events_server.base_url], tmp_path, args) as router:
            if mode == "events":
                wait_for(
                    lambda r=router: events_ready(r, len(plan.all_prefixes())),
                    "every prefix whole from the events",
                )
            figures[mode] = replay(router, events_server, words, traffic == "past-router", GAP_S)
    record_property("replay", figures)
    sizes = [p.tokens for p in plan.all_prefixes()]
    headroom = plan.arithmetic.headroom_tokens
    print(
        f"\nreplay {traffic}: prefixes {sizes} tokens, headroom {headroom}, other traffic "
        f"{other} tokens, {GAP_S} s between requests: {figures}"
    )
    events, heuristic = figures["events"], figures["heuristic"]
    assert events["evictions_seen"] >= 1, figures  # the traffic did evict planned prefixes
    assert events["short"] <= heuristic["short"], figures
    if traffic == "past-router":  # keep-warm cannot count what it does not see
        assert heuristic["short"] >= 0.1 * REPLAY_QUESTIONS, figures
        assert events["short"] < heuristic["short"], figures
        # ... and the events do it with fewer requests than the touches (one re-warm request
        # carries every prefix due on the upstream)
        assert events["requests"] < heuristic["requests"], figures
