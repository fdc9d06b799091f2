"""The router's upstream HTTP client, measured against the alternative it replaced.

The same ~190 KB chat body (the size of a ~29K-token resident prefix) is POSTed to a server that
answers at once (benchmarks/instant_upstream.py, its own process), so what is measured is the
client's own cost per request: `AsyncVllmClient.generate` (aiohttp) vs an `httpx.AsyncClient`
configured as the router's was (keep-alive pool, the same headers). Rounds alternate between the
two in one run; the figures are medians over all rounds.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import uvloop
from pytest_benchmark.fixture import BenchmarkFixture

from residency.launcher import ManagedServer, free_port
from residency.vllm_client import AsyncVllmClient, endpoints, open_session

HERE = Path(__file__).resolve().parent
ROUNDS = 6
PER_ROUND = 300
BODY = orjson.dumps(
    {
        "model": "instant",
        "messages": [{"role": "system", "content": "霧信号と灯台の点検記録。" * 5_300}],
        "max_tokens": 1,
    }
)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    server = ManagedServer(
        "instant upstream",
        [sys.executable, str(HERE / "instant_upstream.py"), str(port)],
        port=port,
        log_path=tmp_path_factory.mktemp("instant") / "upstream.log",
    ).start(timeout_s=30)
    try:
        yield server.url
    finally:
        server.stop()


async def _medians(url: str) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {"aiohttp": [], "httpx": []}
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    headers = endpoints.request_headers(None)
    async with (
        open_session(60.0) as session,
        httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0), limits=limits) as hx,
    ):
        client = AsyncVllmClient(url, session)

        async def via_aiohttp() -> None:
            answer = await client.generate("chat", BODY)
            assert answer.status_code == 200

        async def via_httpx() -> None:
            response = await hx.post(url + endpoints.CHAT, content=BODY, headers=headers)
            assert response.status_code == 200

        calls: dict[str, Callable[[], Awaitable[None]]] = {
            "aiohttp": via_aiohttp,
            "httpx": via_httpx,
        }
        for call in calls.values():  # open the connections, warm both paths
            for _ in range(20):
                await call()
        for _ in range(ROUNDS):
            for name, call in calls.items():
                spent = []
                for _ in range(PER_ROUND):
                    started = time.perf_counter()
                    await call()
                    spent.append(time.perf_counter() - started)
                timings[name].append(statistics.median(spent) * 1000)
    return timings


def test_the_upstream_client_costs_less_than_httpx(
    benchmark: BenchmarkFixture, upstream: str
) -> None:
    timings: dict[str, list[float]] = {}

    def run() -> None:
        timings.update(uvloop.run(_medians(upstream)))

    benchmark.pedantic(run, rounds=1, iterations=1)
    figures = {
        "body_bytes": len(BODY),
        "aiohttp_p50_ms": statistics.median(timings["aiohttp"]),
        "httpx_p50_ms": statistics.median(timings["httpx"]),
        "rounds_aiohttp_ms": timings["aiohttp"],
        "rounds_httpx_ms": timings["httpx"],
    }
    figures["ratio"] = figures["aiohttp_p50_ms"] / figures["httpx_p50_ms"]
    benchmark.extra_info.update(figures)
    print(json.dumps(figures, indent=2))
    assert figures["ratio"] < 0.8, figures
    assert all(a < h for a, h in zip(timings["aiohttp"], timings["httpx"], strict=True)), figures
