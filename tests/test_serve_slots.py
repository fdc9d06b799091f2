"""The --max-concurrent budget against a real router (issue 35, reproductions 5 and 6): a
request takes its slots only once its whole body is in, so half-sent bodies hold none; a request
asking for n (or best_of) completions takes n; past --max-n it is a 400 naming the flag.

Requests in flight are held by a stand-in upstream (tests/held_upstream.py) until the test
releases them: what is in flight is known from the upstream's count and the router's metrics,
never from the clock.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from offline_router import metric, offline_plan, stand_in, wait_for
from router_server import RouterProcess

CHAT = "/v1/chat/completions"
MAX_CONCURRENT = 4
MAX_N = 6
ARGS = (
    "--no-warm",
    "--retriever",
    "bm25",
    "--max-concurrent",
    str(MAX_CONCURRENT),
    "--max-n",
    str(MAX_N),
    "--body-timeout",
    "600",
)


def chat(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "灯台は？"}], "max_tokens": 1, **extra}


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    return offline_plan(tmp_path_factory.mktemp("slots"), tiny_tokenizer_dir)


@pytest.fixture(scope="module")
def held() -> Iterator[str]:
    with stand_in("held_upstream.py") as url:
        yield url


@pytest.fixture(scope="module")
def router(
    plan: Path, held: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RouterProcess]:
    with RouterProcess(plan, [held], tmp_path_factory.mktemp("router"), ARGS) as proc:
        yield proc


def held_now(upstream: str) -> int:
    return int(httpx.get(f"{upstream}/held", timeout=10).json()["held"])


def slots(router: RouterProcess) -> float | None:
    return metric(router.base_url, "residency_router_slots_in_use")


class InFlight:
    """Requests sent from threads, answered once the upstream releases them."""

    def __init__(self, router: RouterProcess) -> None:
        self.router = router
        self.threads: list[threading.Thread] = []
        self.statuses: list[int] = []

    def send(self, body: dict[str, Any]) -> None:
        def run() -> None:
            response = httpx.post(f"{self.router.base_url}{CHAT}", json=body, timeout=120)
            self.statuses.append(response.status_code)

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)

    def join(self) -> list[int]:
        for thread in self.threads:
            thread.join(120)
        return self.statuses


def post(router: RouterProcess, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{router.base_url}{CHAT}", json=body, timeout=60)


def test_fan_out_counts_n_times_against_max_concurrent(router: RouterProcess, held: str) -> None:
    flight = InFlight(router)
    try:
        flight.send(chat(n=3))
        wait_for(lambda: held_now(held) == 1 and slots(router) == 3, "n=3 held, 3 slots")
        refused = post(router, chat(n=2))  # 3 + 2 > 4
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == (
            "rate_limit_error",
            "too_many_concurrent_requests",
        )
        assert "asks for 2" in error["message"]
        assert "--max-concurrent" in error["message"]
        flight.send(chat(best_of=1))  # 3 + 1 = 4: fits
        wait_for(lambda: held_now(held) == 2 and slots(router) == 4, "two held, 4 slots")
        assert post(router, chat()).status_code == 429  # the budget is spent
        too_many = post(router, chat(n=MAX_N + 1))  # refused for --max-n before the budget
        assert too_many.status_code == 400, too_many.text
        assert too_many.json()["error"]["param"] == "n"
        assert f"--max-n {MAX_N}" in too_many.json()["error"]["message"]
    finally:
        httpx.post(f"{held}/release", timeout=10)
    assert flight.join() == [200, 200]
    wait_for(lambda: slots(router) == 0, "the slots given back")


def test_a_request_wider_than_the_budget_runs_alone(router: RouterProcess, held: str) -> None:
    """n=6 with --max-concurrent 4 (and --max-n 6): let in when nothing else is in flight, and
    while it runs nothing else is."""
    flight = InFlight(router)
    try:
        flight.send(chat(n=MAX_N))
        wait_for(lambda: held_now(held) == 1 and slots(router) == MAX_N, "n=6 held alone")
        assert post(router, chat()).status_code == 429
    finally:
        httpx.post(f"{held}/release", timeout=10)
    assert flight.join() == [200]
    wait_for(lambda: slots(router) == 0, "the slots given back")


def half_sent(router: RouterProcess) -> socket.socket:
    """A connection that sends its headers and 10 of its 100 body bytes, then waits."""
    sock = socket.create_connection(("127.0.0.1", router.port), timeout=30)
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{router.port}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    sock.sendall(head.encode() + b'{"messages')
    return sock


def test_half_sent_bodies_hold_no_slot(router: RouterProcess, held: str) -> None:
    """Reproduction 6: more half-sent bodies than --max-concurrent, idle (--body-timeout 600
    here): every other client is still served."""
    socks = [half_sent(router) for _ in range(MAX_CONCURRENT * 2)]
    try:
        wait_for(
            lambda: metric(router.base_url, "residency_router_bodies_receiving") == len(socks),
            f"the router reading {len(socks)} bodies",
        )
        assert slots(router) == 0
        flight = InFlight(router)
        try:
            for _ in range(MAX_CONCURRENT):
                flight.send(chat())
            wait_for(lambda: held_now(held) == MAX_CONCURRENT, "a full budget of requests held")
            assert post(router, chat()).status_code == 429  # the budget is theirs, not the idle
        finally:
            httpx.post(f"{held}/release", timeout=10)
        assert flight.join() == [200] * MAX_CONCURRENT
        body = b'": [{"role": "user", "content": "q"}], "max_tokens": 1}'
        socks[0].sendall(body + b" " * (90 - len(body)))  # now complete: it goes upstream
        wait_for(lambda: held_now(held) == 1, "the completed body's request held")
        httpx.post(f"{held}/release", timeout=10)
        answer = json.loads(_answer(socks[0]).split(b"\r\n\r\n", 1)[1])
        assert answer["choices"][0]["message"]["content"] == "a"
    finally:
        for sock in socks:
            sock.close()
    wait_for(
        lambda: metric(router.base_url, "residency_router_bodies_receiving") == 0,
        "the half-sent bodies dropped",
    )


def _answer(sock: socket.socket) -> bytes:
    """One whole answer with a content-length (the held upstream's JSON)."""
    out = b""
    while b"\r\n\r\n" not in out or len(out.split(b"\r\n\r\n", 1)[1]) < _length(out):
        chunk = sock.recv(65536)
        assert chunk, out
        out += chunk
    return out


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 1 << 30
