"""Re-warms under a sequence-restart flood (issue 42, reproduction 3) in a real router: its
upstream (tests/events_upstream.py) lists this test's ZMQ publisher, which restarts its
sequence every 0.2 s. Re-warms of every reason are held to --rewarm-interval (restart re-warms
went "at once" and chained: one per restart), and a request whose prefix has a re-warm waiting
waits at most --rewarm-wait for it: with the upstream holding the re-warm, the request is
answered all the same."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import orjson
import pytest
import zmq
from offline_router import metric, offline_plan, wait_for
from router_server import RouterProcess

from residency.launcher import free_port
from residency.vllm_client import find_samples, parse_prometheus

TESTS = Path(__file__).resolve().parent
INTERVAL_S = 2.0
FLOOD_S = 6.0
GOOD = msgspec.msgpack.encode([1.0, [], 0])


class Publisher:
    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.port = free_port()
        self.sock = self.ctx.socket(zmq.PUB)
        self.sock.bind(f"tcp://127.0.0.1:{self.port}")
        self.lock = threading.Lock()

    def send(self, seq: int) -> None:
        with self.lock:
            self.sock.send_multipart([b"", seq.to_bytes(8, "big"), GOOD])

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


@pytest.fixture
def setup(tmp_path: Path, tiny_tokenizer_dir: Path) -> Iterator[tuple[RouterProcess, str, Any]]:
    pub = Publisher()
    http_port = free_port()
    up = subprocess.Popen(
        [sys.executable, str(TESTS / "events_upstream.py"), str(http_port), str(pub.port)]
    )
    url = f"http://127.0.0.1:{http_port}"
    plan = offline_plan(tmp_path, tiny_tokenizer_dir)
    args = (
        "--no-warm",
        "--retriever",
        "bm25",
        "--rewarm-interval",
        str(INTERVAL_S),
        "--rewarm-wait",
        "1",
    )
    try:
        wait_for(lambda: _answers(url), "the stand-in upstream", proc=up)
        with RouterProcess(plan, [url], tmp_path, args).start() as router:
            seq = [1]

            def subscribed() -> bool:
                pub.send(seq[0])
                seq[0] += 1
                return (metric(router.base_url, "residency_router_kv_event_batches_total") or 0) > 0

            wait_for(subscribed, "the router to subscribe")
            wait_for(lambda: count(url)["completions"] >= 1, "the learning re-warm")
            yield router, url, pub
    finally:
        httpx.post(f"{url}/release", timeout=10)
        up.terminate()
        up.wait(10)
        pub.close()


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def count(url: str) -> dict[str, int]:
    return dict(httpx.get(f"{url}/count", timeout=10).json())


def restarts(pub: Publisher, seconds: float) -> int:
    """Sequence numbers 0, 5000, 0, ...: every drop of 5000 is a restart to the subscriber."""
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        pub.send(0 if n % 2 else 5000)
        n += 1
        time.sleep(0.2)
    return n // 2


def rewarms(router: RouterProcess, reason: str) -> float:
    text = httpx.get(f"{router.base_url}/metrics", timeout=30).text
    found = find_samples(parse_prometheus(text), "residency_router_prefix_rewarms_total")
    return sum(s.value for s in found if s.labels.get("reason") == reason)


def test_a_restart_flood_costs_one_rewarm_per_interval_and_delays_requests_a_bounded_time(
    setup: tuple[RouterProcess, str, Publisher],
) -> None:
    router, url, pub = setup
    time.sleep(INTERVAL_S)
    before = count(url)["completions"]
    flooded = restarts(pub, FLOOD_S)
    time.sleep(INTERVAL_S + 0.5)  # the last re-warm the flood scheduled goes
    sent = count(url)["completions"] - before
    assert flooded >= 10
    assert rewarms(router, "restart") >= 1  # the restarts were seen and re-warmed
    print(f"\n{flooded} restarts in {FLOOD_S:g} s: {sent} re-warm requests")
    assert 1 <= sent <= FLOOD_S / INTERVAL_S + 2, (sent, flooded)

    httpx.post(f"{url}/hold", timeout=10)  # the next re-warm never answers
    restarts(pub, 0.5)
    wait_for(lambda: count(url)["held"] == 1, "a re-warm held by the upstream")
    body = {"messages": [{"role": "user", "content": "灯台は？"}], "max_tokens": 1}
    answer = httpx.post(f"{router.base_url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    wait_for(
        lambda: router.query_log.read_bytes() != b"", "its log line (written after the answer)"
    )
    line = orjson.loads(router.query_log.read_bytes().splitlines()[-1])
    assert line["prefix"] is not None  # it went out with the prefix whose re-warm is held
    assert count(url)["held"] == 1  # answered while that re-warm is still out
