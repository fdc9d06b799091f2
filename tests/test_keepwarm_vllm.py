"""Keep-warm on a real server: the tiny dense model on vLLM CPU with a 96-block KV cache (the
configuration the KV-event tests share, tests/kv_events_traffic.py; events ignored here with
`--kv-events off`), the English sample planned against it (a shared head and three branches, the
cache full but for the headroom). Long questions routed to one prefix allocate more than the
headroom; then one question goes to the branch that was warmed earliest. Without keep-warm
vLLM's LRU has evicted that branch (the test asserts it, so the traffic is known to be enough);
with keep-warm the router touched it in time and the question finds it cached."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import orjson
import pytest
from kv_events_traffic import filler_words
from router_server import RouterProcess
from vllm_pool import ServerSpec, VllmServerPool

from residency.context.builder import ContextBuilder
from residency.context.headers import PREFIX_HEADER
from residency.context.settings import ContextSettings
from residency.corpus.samples import EN_SAMPLE
from residency.index import open_index
from residency.planning.plan_model import ResidencyPlan, plan_index_dir, read_plan
from residency.query_log import read_query_log

pytestmark = pytest.mark.vllm

HTTP_TIMEOUT_S = 300.0
FILLER_TOKENS = 1_200  # a word no document holds, repeated: each question's own new blocks
MAX_LONG_QUESTIONS = 12


def _long(question: str, tag: str, n: int, words: int) -> str:
    """`question` plus filler: a tag of its own first, so none of its blocks hashes like another
    long question's, then a word no document holds (BM25 ignores it: the route stays)."""
    return f"{question}\n\n#{tag}{n}" + " zq" * words


def _questions(plan: ResidencyPlan, index_dir: Path, words: int) -> tuple[str, str, str, str]:
    """(busy question, its prefix, idle question, its prefix): questions on the resident route,
    the busy one routed alike with any filler; the idle one's prefix is the branch warmed
    earliest among those the busy one does not use (the LRU's first victim)."""
    builder = ContextBuilder(plan, open_index(index_dir), ContextSettings(retriever="bm25"))
    first: dict[str, str] = {}
    for entry in read_query_log(EN_SAMPLE.queries).entries:
        r = builder.retrieve(entry.query)
        if r.route == "resident":
            first.setdefault(r.prefix_id, entry.query)
    order = [p.id for p in plan.prefixes]
    busy = max(first, key=order.index)  # a late branch: the idle one is warmed before it
    idle = min((p for p in first if p != busy), key=order.index)
    for tag in ("off", "on"):
        for n in range(MAX_LONG_QUESTIONS):
            assert builder.retrieve(_long(first[busy], tag, n, words)).prefix_id == busy
    return first[busy], busy, first[idle], idle


def _ask(router: RouterProcess, question: str) -> tuple[str, dict[str, int]]:
    answer = httpx.post(
        f"{router.base_url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": question}], "max_tokens": 1},
        timeout=HTTP_TIMEOUT_S,
    )
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return answer.headers[PREFIX_HEADER], {"prompt": usage["prompt_tokens"], "cached": cached}


def _traffic(
    router: RouterProcess, busy_q: str, busy: str, idle_q: str, headroom: int, words: int, tag: str
) -> tuple[str, dict[str, int]]:
    """Long questions to `busy` until they allocated 1.5 x the headroom, then `idle_q`."""
    allocated = 0
    for n in range(MAX_LONG_QUESTIONS):
        prefix_id, usage = _ask(router, _long(busy_q, tag, n, words))
        assert prefix_id == busy
        allocated += usage["prompt"] - usage["cached"] + 1
        if allocated > 1.5 * headroom:
            break
    assert allocated > 1.5 * headroom, (allocated, headroom)
    return _ask(router, idle_q)


def _counter(metrics: str, name: str, **labels: str) -> float:
    """The sum of counter `name` over the series whose labels include `labels`."""
    total = 0.0
    for line in metrics.splitlines():
        m = re.match(rf"{name}_total\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def test_keep_warm_keeps_an_idle_prefix_cached_that_lru_evicts_without_it(
    vllm_pool: VllmServerPool, kv_events_spec: ServerSpec, kv_events_plan: Path, tmp_path: Path
) -> None:
    server = vllm_pool.get(kv_events_spec)
    plan_path = kv_events_plan
    plan = read_plan(plan_path)
    index_dir = plan_index_dir(plan, plan_path)
    a, block = plan.arithmetic, plan.capacity.block_size
    assert a is not None
    assert len(plan.prefixes) >= 3
    words = filler_words(server, FILLER_TOKENS)
    busy_q, busy, idle_q, idle = _questions(plan, index_dir, words)
    expected = {p.id: p.tokens for p in plan.prefixes}[idle] - block
    upstream = [server.base_url]
    args = ("--retriever", "bm25", "--kv-events", "off")

    httpx.post(f"{server.base_url}/reset_prefix_cache", timeout=60)
    with RouterProcess(plan_path, upstream, tmp_path, (*args, "--no-keep-warm")) as router:
        prefix_id, usage = _traffic(router, busy_q, busy, idle_q, a.headroom_tokens, words, "off")
        metrics = httpx.get(f"{router.base_url}/metrics", timeout=30).text
    assert prefix_id == idle
    assert usage["cached"] < expected, (idle, usage, expected)  # LRU evicted it
    assert _counter(metrics, "residency_router_prefix_evictions", prefix=idle) == 1
    assert _counter(metrics, "residency_router_keep_warm_touches") == 0

    httpx.post(f"{server.base_url}/reset_prefix_cache", timeout=60)
    with RouterProcess(plan_path, upstream, tmp_path, args) as router:  # warms every prefix again
        prefix_id, usage = _traffic(router, busy_q, busy, idle_q, a.headroom_tokens, words, "on")
        metrics = httpx.get(f"{router.base_url}/metrics", timeout=30).text
    assert prefix_id == idle
    assert usage["cached"] >= expected, (idle, usage, expected)
    assert _counter(metrics, "residency_router_prefix_evictions", prefix=idle) == 0
    assert (
        _counter(metrics, "residency_router_keep_warm_touches", prefix=idle, result="cached") >= 1
    )
    assert _counter(metrics, "residency_router_keep_warm_touches", prefix=busy) == 0
    assert _counter(metrics, "residency_router_keep_warm_touches", result="failed") == 0
    logged = [orjson.loads(x) for x in router.query_log.read_bytes().splitlines()]
    assert [r["prefix"] for r in logged][-1] == idle
