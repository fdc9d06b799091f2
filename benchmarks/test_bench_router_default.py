"""What the router adds to each request on its default path (issues 31, 45): `residency serve`
with `--retriever hybrid` (the default: the question is embedded by the int8 engine, then BM25
and FAISS are fused) beside the same with the float32 engine it replaced
(RESIDENCY_E5_ENGINE=float32) and `--retriever bm25`, in front of a server that answers at once
(benchmarks/instant_upstream.py), so the difference is the router's own time.

Measured side by side in one run (shared, noisy machines): for every question, one request
straight to the upstream and one through each router, in rotating order, non-streaming. Added
milliseconds = a router's latency minus the direct request's latency of the same round; p50 and
p99 over ~270 distinct questions (the harbor-lights evaluation questions and query log: every one
new to the router, so each is embedded), then one question asked again and again (its vector is
kept with its ranking and route: a lookup on the event loop). Reported beside them: the
router's own timing of retrieval (query log `retrieval_ms`) and of everything before forwarding
(`forward_ms`).

Targets (2 cores): hybrid added p50 <= 15 ms, p99 <= 40 ms; a repeated question <= 1 ms p50
(nothing recomputed). The uncached figures are reported, and asserted only against a loose
ceiling: the question's forward pass through the embedder (~1 GFLOP for a 24-token question, on
one core) is most of it and scales with the CPU and its load (the machine is named in the
output). A repeated question is asserted to be retrieved in under 1 ms (no search at all).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_plan import plan_with_cli
from pytest_benchmark.fixture import BenchmarkFixture

from residency.context.builder import ContextBuilder
from residency.context.prompt import assemble_messages
from residency.context.settings import ContextSettings
from residency.index import IndexOptions, build_index, open_index
from residency.machine import machine_info
from residency.planning.plan_model import read_plan
from residency.stats import percentile
from residency.tokenizer import LocalTokenizer

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))  # the server harnesses live beside the tests
from router_server import RouterProcess  # noqa: E402

SAMPLE = REPO_ROOT / "residency" / "data" / "corpora" / "harbor-lights"
CHAT = "/v1/chat/completions"
REPEATS = 100
# name -> (serve flags, environment): the default, the engine it replaced, BM25 alone
ROUTERS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "hybrid": ((), {}),
    "hybrid_float32": ((), {"RESIDENCY_E5_ENGINE": "float32"}),
    "bm25": (("--retriever", "bm25"), {}),
}
RETRIEVERS = tuple(ROUTERS)


def _questions() -> list[str]:
    """Every distinct question of the sample's evaluation set and query log."""
    rows = [
        json.loads(line)
        for name in ("qa.jsonl", "queries.jsonl")
        for line in (SAMPLE / name).read_text("utf-8").splitlines()
        if line.strip()
    ]
    return list(dict.fromkeys(r["query"] for r in rows))


@pytest.fixture(scope="module")
def plan_and_index(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path
) -> tuple[Path, Path]:
    """The sample indexed with the default embedder, planned for a 32K window by the CLI."""
    tmp = tmp_path_factory.mktemp("bench-router-default")
    index = tmp / "index"
    build_index(SAMPLE / "docs", index, IndexOptions(), LocalTokenizer(tiny_tokenizer_dir), None)
    out = tmp / "plan.json"
    return plan_with_cli(index, out, 32768), index


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    """benchmarks/instant_upstream.py on a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(HERE / "instant_upstream.py"), str(port)])
    try:
        with httpx.Client(timeout=5) as client:
            for _ in range(100):
                try:
                    client.get(f"http://127.0.0.1:{port}/health")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def routers(
    plan_and_index: tuple[Path, Path], upstream: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, RouterProcess]]:
    plan, _ = plan_and_index
    started: dict[str, RouterProcess] = {}
    try:
        for name, (flags, env) in ROUTERS.items():
            started[name] = RouterProcess(
                plan, [upstream], tmp_path_factory.mktemp(name), ("--no-warm", *flags), env=env
            ).start()
        yield started
    finally:
        for proc in started.values():
            proc.stop()


def _direct_body(plan_and_index: tuple[Path, Path], upstream: str, question: str) -> bytes:
    """The request the router would send for ``question`` (same size on the wire)."""
    plan, index = plan_and_index
    builder = ContextBuilder(read_plan(plan), open_index(index), ContextSettings(retriever="bm25"))
    r = builder.retrieve(question)
    messages = assemble_messages(
        [{"role": "user", "content": question}],
        builder.prefix_text(r.prefix_id),
        builder.render(r, r.chunk_ids),
    )
    body = {"model": "instant", "messages": messages, "max_tokens": 1}
    return json.dumps(body, ensure_ascii=False).encode()


def _post(client: httpx.Client, url: str, content: bytes) -> float:
    started = time.perf_counter()
    response = client.post(url, content=content, headers={"Content-Type": "application/json"})
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text
    return elapsed * 1000


def _router_timings(proc: RouterProcess, first: int, last: int) -> dict[str, float]:
    """The router's own timings of its query-log records [first, last) (counted from the end)."""
    lines = proc.query_log.read_text("utf-8").splitlines()
    records = [json.loads(x) for x in lines[len(lines) - first : len(lines) - last]]
    retrieval = [x["retrieval_ms"] for x in records]
    forward = [x["forward_ms"] for x in records if x.get("forward_ms") is not None]
    return {
        "retrieval_p50_ms": percentile(retrieval, 0.50),
        "retrieval_p99_ms": percentile(retrieval, 0.99),
        "forward_p50_ms": percentile(forward, 0.50),
        "forward_p99_ms": percentile(forward, 0.99),
    }


def test_router_added_ms_hybrid_default_vs_bm25(
    benchmark: BenchmarkFixture,
    routers: dict[str, RouterProcess],
    upstream: str,
    plan_and_index: tuple[Path, Path],
) -> None:
    questions = _questions()
    assert len(questions) >= 200
    direct_body = _direct_body(plan_and_index, upstream, questions[0])
    bodies = [
        json.dumps(
            {"messages": [{"role": "user", "content": q}], "max_tokens": 1}, ensure_ascii=False
        ).encode()
        for q in questions
    ]
    direct: list[float] = []
    added: dict[str, list[float]] = {name: [] for name in RETRIEVERS}
    repeated: dict[str, list[float]] = {name: [] for name in RETRIEVERS}
    repeated_direct: list[float] = []
    urls = {name: proc.base_url + CHAT for name, proc in routers.items()}
    with httpx.Client(timeout=120) as client:
        for name in RETRIEVERS:  # connections, caches and the first request's imports
            _post(client, urls[name], bodies[-1])
        _post(client, upstream + CHAT, direct_body)

        def run() -> None:
            for i, body in enumerate(bodies[:-1]):  # each question new to both routers
                order = ["direct", *RETRIEVERS]
                order = order[i % len(order) :] + order[: i % len(order)]
                targets = {"direct": (upstream + CHAT, direct_body)}
                targets.update({name: (urls[name], body) for name in RETRIEVERS})
                took = {name: _post(client, *targets[name]) for name in order}
                direct.append(took["direct"])
                for name in RETRIEVERS:
                    added[name].append(took[name] - took["direct"])
            again = bodies[0]  # asked before: its vector is kept
            for _ in range(REPEATS):
                d = _post(client, upstream + CHAT, direct_body)
                repeated_direct.append(d)
                for name in RETRIEVERS:
                    repeated[name].append(_post(client, urls[name], again) - d)

        benchmark.pedantic(run, rounds=1, iterations=1)

    n = len(bodies) - 1
    for proc in routers.values():  # the query log is written after the answer: wait for it
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if len(proc.query_log.read_text("utf-8").splitlines()) >= n + REPEATS + 1:
                break
            time.sleep(0.2)
    figures: dict[str, Any] = {
        "machine": machine_info().describe(),
        "questions": n,
        "direct_p50_ms": percentile(direct, 0.50),
    }
    for name in RETRIEVERS:
        figures[f"{name}_added_p50_ms"] = percentile(added[name], 0.50)
        figures[f"{name}_added_p99_ms"] = percentile(added[name], 0.99)
        figures[f"{name}_repeated_added_p50_ms"] = percentile(repeated[name], 0.50)
        own = _router_timings(routers[name], REPEATS + n, REPEATS)
        figures.update({f"{name}_{k}": v for k, v in own.items()})
        kept = _router_timings(routers[name], REPEATS, 0)
        figures[f"{name}_repeated_retrieval_p50_ms"] = kept["retrieval_p50_ms"]
        figures[f"{name}_repeated_forward_p50_ms"] = kept["forward_p50_ms"]
    benchmark.extra_info.update(figures)
    print(json.dumps(figures, indent=2, ensure_ascii=False))
    # The embedding is the difference between the two routers; BM25's path stays cheap.
    assert figures["bm25_added_p50_ms"] <= 15.0, figures
    # A repeated question is a lookup: its retrieval (timed by the router) stays under 1 ms, and
    # the router's own time to forward it (arrival -> handed upstream, timed by the router)
    # within 1 ms of BM25's repeated one. The whole request's added ms is reported: the proxying
    # itself, the same on every path, moves with the machine's load.
    assert figures["hybrid_repeated_retrieval_p50_ms"] <= 1.0, figures
    repeated_forward = figures["hybrid_repeated_forward_p50_ms"]
    assert repeated_forward <= figures["bm25_repeated_forward_p50_ms"] + 1.0, figures
    assert figures["hybrid_added_p50_ms"] <= 200.0, figures  # loose: the CPU's forward pass
