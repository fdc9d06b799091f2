"""Residency from vLLM's KV events on a real server: the tiny dense model on vLLM CPU with events
published over ZMQ and a small KV cache (--num-gpu-blocks-override), so that a few requests sent
to vLLM past the router evict a planned prefix. With events the router sees the BlockRemoved,
re-warms the prefix and the next question finds it cached; with `--kv-events off` (keep-warm
counting the tokens it routed, blind to traffic past it) the same traffic leaves questions to
find their prefix short. The replay counts both: requests that found their prefix short, and
touches / re-warms sent."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest
from conftest import DENSE_SERVER_ARGS
from router_server import RouterProcess
from vllm_pool import ServerSpec, VllmServerPool
from vllm_server import VllmServer

from residency.corpus.samples import EN_SAMPLE
from residency.index import build_index
from residency.launcher import free_port
from residency.planning.plan_model import read_plan
from residency.planning.run import sample_index_options
from residency.tokenizer import ServerTokenizer
from residency.vllm_client import VllmClient, find_samples, parse_prometheus

pytestmark = pytest.mark.vllm

BLOCK_SIZE = 128  # named, so that --num-gpu-blocks-override means a known number of tokens
KV_BLOCKS = 96  # 12,288 tokens: the plan's prefixes and little else
MAX_MODEL_LEN = 8192
HTTP_TIMEOUT_S = 300.0
DIRECT_TOKENS = 3_000  # one request past the router: about a quarter of the cache
REPLAY_QUESTIONS = 24
GAP_S = 2.0  # between one request's answer and the next request, in both modes


@pytest.fixture(scope="module")
def events_server(vllm_pool: VllmServerPool, dense_model_dir: Path) -> VllmServer:
    """The tiny dense model with KV events on (PUB and replay bound on free ports)."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{free_port()}",
        "replay_endpoint": f"tcp://*:{free_port()}",
    }
    args = (
        *DENSE_SERVER_ARGS,
        "--block-size", str(BLOCK_SIZE),
        "--num-gpu-blocks-override", str(KV_BLOCKS),
        "--kv-events-config", orjson.dumps(config).decode(),
    )  # fmt: skip
    spec = ServerSpec(dense_model_dir, args, MAX_MODEL_LEN, name="dense-kv-events")
    return vllm_pool.get(spec)


@pytest.fixture(scope="module")
def events_plan(events_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The English sample planned against that server (its tokenizer, its 96 blocks)."""
    root = tmp_path_factory.mktemp("kv-events")
    index_dir = root / "index"
    build_index(
        EN_SAMPLE.docs,
        index_dir,
        sample_index_options(EN_SAMPLE, dense=False),
        ServerTokenizer(events_server.base_url),
    )
    out = root / "plan.json"
    done = subprocess.run(
        [
            sys.executable, "-m", "residency", "plan", "--server", events_server.base_url,
            "--platform", "cpu", "--index", str(index_dir), "--log", str(EN_SAMPLE.queries),
            "-o", str(out),
        ],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


def metric(router: RouterProcess, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`."""
    text = httpx.get(f"{router.base_url}/metrics", timeout=30).text
    found = find_samples(parse_prometheus(text), name)
    return sum(s.value for s in found if labels.items() <= s.labels.items())


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def ask(router: RouterProcess, question: str) -> tuple[str, int, int]:
    """(prefix id, prompt tokens, cached tokens) of one routed question."""
    answer = httpx.post(
        f"{router.base_url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": question}], "max_tokens": 1},
        timeout=HTTP_TIMEOUT_S,
    )
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    prefix = answer.headers["x-residency-prefix"]
    return prefix, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def direct(server: VllmServer, n: int, words: int) -> None:
    """A request sent to vLLM past the router: unique text (a tag of its own first), so every
    block of it is new and allocates as much of the cache."""
    prompt = f"#direct{n}-{time.monotonic_ns()}" + " zq" * words
    answer = httpx.post(
        f"{server.base_url}/v1/completions",
        json={"model": "tiny", "prompt": prompt, "max_tokens": 1},
        timeout=HTTP_TIMEOUT_S,
    )
    assert answer.status_code == 200, answer.text


def filler_words(server: VllmServer, tokens: int) -> int:
    with VllmClient(server.base_url) as client:
        per_word = len(client.tokenize(" zq" * 100)) / 100
    return int(tokens / per_word)


def questions(n: int) -> list[str]:
    lines = EN_SAMPLE.questions.read_bytes().splitlines()
    return [str(orjson.loads(x)["query"]) for x in lines if x.strip()][:n]


def events_ready(router: RouterProcess, prefixes: int) -> bool:
    """Events mode on upstream 0 with every prefix's chain whole."""
    if metric(router, "residency_router_kv_events_mode", upstream="0") != 1:
        return False
    text = httpx.get(f"{router.base_url}/metrics", timeout=30).text
    samples = parse_prometheus(text)
    total = {
        s.labels["prefix"]: s.value for s in find_samples(samples, "residency_router_prefix_blocks")
    }
    held = {
        s.labels["prefix"]: s.value
        for s in find_samples(samples, "residency_router_prefix_resident_blocks")
    }
    return len(total) == prefixes and all(total[p] > 0 and held.get(p) == total[p] for p in total)


def replay(
    router: RouterProcess, server: VllmServer, words: int, past: bool, gap_s: float
) -> dict[str, float]:
    """REPLAY_QUESTIONS questions, each followed by DIRECT_TOKENS of other traffic: a request
    sent to vLLM past the router (`past`), or the next question carrying them itself (a
    long question through the router, which keep-warm's count sees); the next question comes
    `gap_s` after it (the same arrival process in both modes). What it cost."""
    for n, question in enumerate(questions(REPLAY_QUESTIONS)):
        if past:
            ask(router, question)
            direct(server, n, words)
        else:
            ask(router, f"{question}\n\n#long{n}-{time.monotonic_ns()}" + " zq" * words)
        time.sleep(gap_s)  # think time: part of the replayed traffic, not a wait for a result
    return {
        "questions": REPLAY_QUESTIONS,
        "short": metric(router, "residency_router_prefix_evictions_total"),
        "touches": metric(router, "residency_router_keep_warm_touches_total"),
        "rewarms": metric(router, "residency_router_prefix_rewarms_total", result="ok")
        - metric(router, "residency_router_prefix_rewarms_total", reason="learn", result="ok"),
        "learn": metric(router, "residency_router_prefix_rewarms_total", reason="learn"),
        "evictions_seen": metric(router, "residency_router_prefix_block_evictions_total"),
    }


def test_an_evicted_prefix_is_rewarmed_from_the_events_and_found_cached(
    events_server: VllmServer, events_plan: Path, tmp_path: Path
) -> None:
    plan = read_plan(events_plan)
    prefixes = len(plan.all_prefixes())
    words = filler_words(events_server, DIRECT_TOKENS)
    httpx.post(f"{events_server.base_url}/reset_prefix_cache", timeout=60)
    with RouterProcess(events_plan, [events_server.base_url], tmp_path, ("--retriever", "bm25",
                       "--rewarm-interval", "0.5")) as router:  # fmt: skip
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
            lambda: metric(router, "residency_router_prefix_rewarms_total", reason="evicted",
                           result="ok") >= 1,
            "a re-warm after the eviction",
        )  # fmt: skip
        wait_for(lambda: events_ready(router, prefixes), "every prefix whole again")
        for question in questions(8):
            ask(router, question)
        assert metric(router, "residency_router_prefix_evictions_total") == 0
        assert metric(router, "residency_router_keep_warm_touches_total") == 0
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


@pytest.mark.parametrize("traffic", ["past-router", "through-router"])
def test_replay_events_against_the_heuristic(
    events_server: VllmServer, events_plan: Path, tmp_path: Path, traffic: str,
    record_property: Callable[[str, object], None],
) -> None:  # fmt: skip
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
                wait_for(lambda r=router: events_ready(r, len(plan.all_prefixes())),
                         "every prefix whole from the events")  # fmt: skip
            figures[mode] = replay(router, events_server, words, traffic == "past-router", GAP_S)
    record_property("replay", figures)
    sizes = [p.tokens for p in plan.all_prefixes()]
    headroom = plan.arithmetic.headroom_tokens
    print(f"\nreplay {traffic}: prefixes {sizes} tokens, headroom {headroom}, other traffic "
          f"{other} tokens, {GAP_S} s between requests: {figures}")  # fmt: skip
    events, heuristic = figures["events"], figures["heuristic"]
    assert events["evictions_seen"] >= 1, figures  # the traffic did evict planned prefixes
    assert events["short"] <= heuristic["short"], figures
    if traffic == "past-router":  # keep-warm cannot count what it does not see
        assert heuristic["short"] >= 0.1 * REPLAY_QUESTIONS, figures
        assert events["short"] < heuristic["short"], figures
