"""Traffic and readings for the KV-event tests and benchmark (tests/test_kv_events_vllm.py,
benchmarks/test_bench_kv_events.py): the tiny dense model on vLLM CPU with events published over
ZMQ and a small KV cache (--num-gpu-blocks-override), the English sample planned against it, and
requests sent past the router that evict a planned prefix."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
import orjson
from residency_cli import run_cli
from router_server import RouterProcess
from vllm_server import VllmServer

from residency.corpus.samples import EN_SAMPLE
from residency.index import build_index
from residency.launcher import free_port
from residency.planning.run import sample_index_options
from residency.tokenizer import ServerTokenizer
from residency.vllm_client import VllmClient, find_samples, parse_prometheus

BLOCK_SIZE = 128  # named, so that --num-gpu-blocks-override means a known number of tokens
KV_BLOCKS = 96  # 12,288 tokens: the plan's prefixes and little else
MAX_MODEL_LEN = 8192
HTTP_TIMEOUT_S = 300.0
DIRECT_TOKENS = 3_000  # one request past the router: about a quarter of the cache
REPLAY_QUESTIONS = 24
GAP_S = 2.0  # between one request's answer and the next request, in both modes


def events_server_args(base: Sequence[str]) -> tuple[str, ...]:
    """``base`` plus events on (PUB and replay bound on free ports) and the small cache."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{free_port()}",
        "replay_endpoint": f"tcp://*:{free_port()}",
    }
    return (
        *base,
        "--block-size",
        str(BLOCK_SIZE),
        "--num-gpu-blocks-override",
        str(KV_BLOCKS),
        "--kv-events-config",
        orjson.dumps(config).decode(),
    )


def plan_for_events(server: VllmServer, root: Path) -> Path:
    """The English sample planned against ``server`` (its tokenizer, its 96 blocks)."""
    index_dir = root / "index"
    build_index(
        EN_SAMPLE.docs,
        index_dir,
        sample_index_options(EN_SAMPLE, dense=False),
        ServerTokenizer(server.base_url),
    )
    out = root / "plan.json"
    done = run_cli(
        "plan",
        "--server",
        server.base_url,
        "--platform",
        "cpu",
        "--index",
        str(index_dir),
        "--log",
        str(EN_SAMPLE.queries),
        "-o",
        str(out),
        timeout=900,
    )
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
    `gap_s` after it (the same arrival process in both modes). What it cost: questions that
    found their prefix short, and what the router sent to keep prefixes cached (requests, the
    prefixes they carried, the tokens they made vLLM prefill), learning probes left out."""
    before = {
        "requests": metric(router, "residency_router_keep_warm_requests_total"),
        "prefill_tokens": metric(router, "residency_router_keep_warm_prefill_tokens_total"),
    }
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
        "requests": metric(router, "residency_router_keep_warm_requests_total")
        - before["requests"],
        "prefill_tokens": metric(router, "residency_router_keep_warm_prefill_tokens_total")
        - before["prefill_tokens"],
        "evictions_seen": metric(router, "residency_router_prefix_block_evictions_total"),
    }
