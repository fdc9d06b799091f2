"""Keep-warm on a real server: SmolLM2-135M-Instruct on vLLM CPU, 1 GiB KV cache, the default
plan for the English sample (a shared head and many small branches, the cache full but for the
headroom). Long questions routed to one prefix allocate more than the headroom; then one
question goes to the branch that was warmed earliest. Without keep-warm vLLM's LRU has evicted
that branch (the test asserts it, so the traffic is known to be enough); with keep-warm the
router touched it in time and the question finds it cached."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest
from router_server import RouterProcess
from vllm_server import VllmServer

from residency.corpus.samples import EN_SAMPLE
from residency.index import open_index
from residency.planning.plan_model import ResidencyPlan, read_plan
from residency.query_log import read_query_log
from residency.serve.context import ContextBuilder
from residency.serve.headers import PREFIX_HEADER
from residency.serve.settings import ServeSettings

pytestmark = pytest.mark.vllm

HTTP_TIMEOUT_S = 300.0
FILLER_TOKENS = 1_800  # a word no document holds, repeated: each question's own new blocks
MAX_LONG_QUESTIONS = 12


@pytest.fixture(scope="module")
def default_plan(
    vllm_real_server: VllmServer,
    en_real_index: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, Path]:
    """(plan.json as `residency plan` makes it by default, its BM25 index)."""
    root = tmp_path_factory.mktemp("keepwarm-real")
    index_dir = en_real_index
    out = root / "plan.json"
    done = subprocess.run(
        [
            sys.executable, "-m", "residency", "plan", "--server", vllm_real_server.base_url,
            "--platform", "cpu", "--index", str(index_dir), "--log", str(EN_SAMPLE.queries),
            "-o", str(out),
        ],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out, index_dir


def _long(question: str, tag: str, n: int, words: int) -> str:
    """`question` plus filler: a tag of its own first, so none of its blocks hashes like another
    long question's, then a word no document holds (BM25 ignores it: the route stays)."""
    return f"{question}\n\n#{tag}{n}" + " zq" * words


def _questions(plan: ResidencyPlan, index_dir: Path, words: int) -> tuple[str, str, str, str]:
    """(busy question, its prefix, idle question, its prefix): questions on the resident route,
    the busy one routed alike with any filler; the idle one's prefix is the branch warmed
    earliest among those the busy one does not use (the LRU's first victim)."""
    settings = ServeSettings(plan=Path("plan.json"), upstreams=("x",), log=None, retriever="bm25")
    builder = ContextBuilder(plan, open_index(index_dir), settings)
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


def _filler_words(server: VllmServer) -> int:
    """How many filler words make FILLER_TOKENS tokens with the server's tokenizer."""
    from residency.vllm_client import VllmClient

    with VllmClient(server.base_url) as client:
        per_word = len(client.tokenize(" zq" * 100)) / 100
    return int(FILLER_TOKENS / per_word)


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
    vllm_real_server: VllmServer, default_plan: tuple[Path, Path], tmp_path: Path
) -> None:
    plan_path, index_dir = default_plan
    plan = read_plan(plan_path)
    a, block = plan.arithmetic, plan.capacity.block_size
    assert a is not None
    assert len(plan.prefixes) >= 4
    words = _filler_words(vllm_real_server)
    busy_q, busy, idle_q, idle = _questions(plan, index_dir, words)
    expected = {p.id: p.tokens for p in plan.prefixes}[idle] - block
    upstream = [vllm_real_server.base_url]
    args = ("--retriever", "bm25")

    with RouterProcess(plan_path, upstream, tmp_path, (*args, "--no-keep-warm")) as router:
        prefix_id, usage = _traffic(router, busy_q, busy, idle_q, a.headroom_tokens, words, "off")
        metrics = httpx.get(f"{router.base_url}/metrics", timeout=30).text
    assert prefix_id == idle
    assert usage["cached"] < expected, (idle, usage, expected)  # LRU evicted it
    assert _counter(metrics, "residency_router_prefix_evictions", prefix=idle) == 1
    assert _counter(metrics, "residency_router_keep_warm_touches") == 0

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
