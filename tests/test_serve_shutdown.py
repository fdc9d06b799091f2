"""SIGTERM with requests in flight (issue 42, reproduction 7) against a real router whose
upstream holds every answer (tests/held_upstream.py): the router says it is draining at
/health, stops accepting, and at --shutdown-timeout answers each request still running with an
OpenAI-shaped 503; every one of them has its query-log line, and nothing ends in a traceback."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from offline_router import offline_plan, stand_in, wait_for
from router_server import RouterProcess

CHAT = "/v1/chat/completions"
SHUTDOWN_S = 3.0


@pytest.fixture(scope="module")
def held() -> Iterator[str]:
    with stand_in("held_upstream.py") as url:
        yield url


def held_now(upstream: str) -> int:
    return int(httpx.get(f"{upstream}/held", timeout=10).json()["held"])


def test_sigterm_with_four_requests_in_flight_answers_and_logs_each_without_a_traceback(
    tmp_path: Path, tiny_tokenizer_dir: Path, held: str
) -> None:
    plan = offline_plan(tmp_path, tiny_tokenizer_dir)
    args = ("--no-warm", "--retriever", "bm25", "--shutdown-timeout", str(SHUTDOWN_S))
    router = RouterProcess(plan, [held], tmp_path, args).start()
    answers: list[tuple[int, bytes]] = []

    def ask(stream: bool, n: int) -> None:
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": f"question {n}"}],
            "max_tokens": 1,
            "stream": stream,
        }
        with httpx.stream("POST", f"{router.base_url}{CHAT}", json=body, timeout=60) as r:
            answers.append((r.status_code, r.read()))

    threads = [threading.Thread(target=ask, args=(n % 2 == 0, n)) for n in range(4)]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: held_now(held) == 4, "four requests held upstream")
        os.kill(router.pid or 0, signal.SIGTERM)
        health = httpx.get(f"{router.base_url}/health", timeout=10)
        assert (health.status_code, health.json()["status"]) == (503, "draining")
        ready = httpx.get(f"{router.base_url}/ready", timeout=10)
        assert (ready.status_code, ready.json()["status"]) == (503, "draining")
        for t in threads:
            t.join(60)
        deadline = time.monotonic() + 30
        while router._process is not None and router._process.poll() is None:
            assert time.monotonic() < deadline, "the router did not exit after draining"
            time.sleep(0.1)
    finally:
        httpx.post(f"{held}/release", timeout=10)
        router.stop()
    assert len(answers) == 4
    for status, content in answers:
        assert status == 503, content
        assert orjson.loads(content)["error"]["code"] == "shutting_down"
    lines = [orjson.loads(x) for x in router.query_log.read_bytes().splitlines()]
    assert sorted(x["query"] for x in lines) == [f"question {n}" for n in range(4)]
    assert {(x["outcome"], x["status_code"]) for x in lines} == {("unavailable", 503)}
    text = router.log_text()
    assert "Traceback" not in text, text
    assert "timeout graceful shutdown exceeded" not in text
