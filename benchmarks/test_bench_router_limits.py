"""The router's own time under hostile requests (issue 21's targets), in front of a server that
answers at once (benchmarks/instant_upstream.py), so what is measured is the router alone:

- a normal request's latency alone vs while two 2 MB questions are in flight, back to back
  (target: at most 2x): with the default limits (they are refused, 413) and with
  --max-body-bytes raised so they are taken, retrieved for (their first --max-question-chars)
  and forwarded;
- /health latency while those run (retrieval off the event loop: health never waits on it);
- the slowest answer to each of the issue's reproductions that the router refuses itself
  (target: <= 1 s each).
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_plan import plan_with_cli
from pytest_benchmark.fixture import BenchmarkFixture

from residency.index import IndexOptions, build_index
from residency.tokenizer import LocalTokenizer

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))  # the server harnesses live beside the tests
from router_server import RouterProcess  # noqa: E402

CORPUS = REPO_ROOT / "residency" / "data" / "corpora" / "harbor-lights" / "docs"
CHAT = "/v1/chat/completions"
NORMAL = {"messages": [{"role": "user", "content": "霧信号はどの灯台にある？"}], "max_tokens": 1}
BIG_CHARS = 700_000  # 3 bytes each in UTF-8: a ~2 MB question
SAMPLES = 40


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    tmp = tmp_path_factory.mktemp("bench-limits")
    build_index(
        CORPUS, tmp / "index", IndexOptions(dense=False), LocalTokenizer(tiny_tokenizer_dir), None
    )
    out = tmp / "plan.json"
    return plan_with_cli(tmp / "index", out, 32768)


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    """benchmarks/instant_upstream.py on a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(HERE / "instant_upstream.py"), str(port)])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


# default: the 2 MB bodies are refused (413) by --max-body-bytes 1 MiB; raised: taken whole.
LIMITS = {"default": (), "raised": ("--max-body-bytes", str(8 * 1024 * 1024))}


@pytest.fixture(scope="module", params=list(LIMITS))
def router(
    request: pytest.FixtureRequest,
    plan: Path,
    upstream: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RouterProcess]:
    args = ("--no-warm", "--retriever", "bm25", *LIMITS[request.param])
    with RouterProcess(plan, [upstream], tmp_path_factory.mktemp("r"), args) as proc:
        proc.limits = request.param  # type: ignore[attr-defined]
        yield proc


def _timed(client: httpx.Client, method: str, url: str, **kw: Any) -> tuple[float, int]:
    started = time.perf_counter()
    response = client.request(method, url, **kw)
    return time.perf_counter() - started, response.status_code


def test_normal_requests_beside_two_2mb_questions(
    benchmark: BenchmarkFixture, router: RouterProcess
) -> None:
    url = router.base_url + CHAT
    big = json.dumps(
        {"messages": [{"role": "user", "content": "灯" * BIG_CHARS}], "max_tokens": 1},
        ensure_ascii=False,
    ).encode()
    taken = router.limits == "raised"  # type: ignore[attr-defined]
    alone: list[float] = []
    beside: list[float] = []
    health: list[float] = []
    big_s: list[float] = []
    stop = threading.Event()

    def hammer() -> None:
        with httpx.Client(timeout=120) as c:
            while not stop.is_set():
                try:
                    s, status = _timed(
                        c, "POST", url, content=big, headers={"Content-Type": "application/json"}
                    )
                except httpx.TransportError:  # refused before the client finished sending
                    assert not taken
                    continue
                assert status == (200 if taken else 413)
                big_s.append(s)

    def run() -> None:
        with httpx.Client(timeout=60) as client:
            for _ in range(5):
                _timed(client, "POST", url, json=NORMAL)
            for _ in range(SAMPLES):
                alone.append(_timed(client, "POST", url, json=NORMAL)[0])
            threads = [threading.Thread(target=hammer) for _ in range(2)]
            for t in threads:
                t.start()
            time.sleep(0.5)
            for _ in range(SAMPLES):
                beside.append(_timed(client, "POST", url, json=NORMAL)[0])
                health.append(_timed(client, "GET", router.base_url + "/health")[0])
            stop.set()
            for t in threads:
                t.join(120)

    benchmark.pedantic(run, rounds=1, iterations=1)
    figures = {
        "normal_alone_p50_ms": round(statistics.median(alone) * 1000, 2),
        "normal_beside_two_2mb_p50_ms": round(statistics.median(beside) * 1000, 2),
        "ratio_p50": round(statistics.median(beside) / statistics.median(alone), 2),
        "health_beside_p50_ms": round(statistics.median(health) * 1000, 2),
        "health_beside_max_ms": round(max(health) * 1000, 2),
        "limits": router.limits,  # type: ignore[attr-defined]
        "big_request_p50_ms": round(statistics.median(big_s) * 1000, 1) if big_s else None,
        "big_requests": len(big_s),
    }
    # Against an upstream that answers in 2 ms the ratio measures the machine more than the
    # router (2 cores shared with two clients uploading 2 MB each, back to back: refused bodies
    # slow a normal request about as much as taken ones). The 2x is against a real
    # request (0.5 s there); the added milliseconds are what must stay small.
    added_ms = figures["normal_beside_two_2mb_p50_ms"] - figures["normal_alone_p50_ms"]
    figures["added_p50_ms"] = round(added_ms, 2)
    benchmark.extra_info.update(figures)
    print(json.dumps(figures, indent=2))
    assert added_ms <= 25, figures
    assert figures["health_beside_max_ms"] <= 100, figures  # the event loop keeps turning


REFUSALS: list[tuple[str, dict[str, str], bytes]] = [
    ("1 stream not boolean", {}, b'{"messages":[{"role":"user","content":"q"}],"stream":"false"}'),
    ("3 text/plain", {"Content-Type": "text/plain"}, b'{"messages":[]}'),
    ("3 foreign Origin", {"Origin": "https://evil.example"}, b"{}"),
    ("3 rebound Host", {"Host": "evil.example"}, b"{}"),
    (
        "4 stream_options string",
        {},
        b'{"messages":[{"role":"user","content":"q"}],"stream":true,"stream_options":"x"}',
    ),
    ("8 echo", {}, b'{"messages":[{"role":"user","content":"q"}],"echo":true}'),
    ("9 non-object messages", {}, b'{"messages":[null,5,{"role":"user","content":"q"}]}'),
]


def test_refusals_take_the_router_under_a_second(
    benchmark: BenchmarkFixture, router: RouterProcess
) -> None:
    times: dict[str, float] = {}

    def run() -> None:
        with httpx.Client(timeout=120) as client:
            for name, headers, body in REFUSALS:
                sent = {"Content-Type": "application/json", **headers}
                s, status = _timed(
                    client, "POST", router.base_url + CHAT, content=body, headers=sent
                )
                assert 400 <= status < 500, (name, status)
                times[name] = round(s * 1000, 1)

        times["2 50 MB body declared"] = round(_declared_50mb(router) * 1000, 1)

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(times)
    print(json.dumps(times, indent=2))
    assert max(times.values()) <= 1000, times


def _declared_50mb(router: RouterProcess) -> float:
    """Seconds to the answer of a request declaring a 50 MB body (64 KB of it sent): a 413."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", router.port), timeout=30) as sock:
        head = (
            f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{router.port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n"
        )
        sock.sendall(head.encode() + b" " * 65_536)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
    return time.perf_counter() - started
