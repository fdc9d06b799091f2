"""What the router refuses on its own, before any upstream is asked: a real `residency serve`
process whose only upstream is a closed port, so a request that gets through every check is
answered 503 (no upstream), and one that does not gets its own 4xx.

Covers issue 21's reproductions 1 to 9 on the router's side. Two tests put a stand-in upstream
in front instead, for what vLLM does not do on demand: answer a stream without `[DONE]`
(benchmarks/instant_upstream.py) and hold a stream open after it (done_then_hold_upstream.py).
The real vLLM side (health, streams, answers, fuzz) is in test_serve_hardening_vllm.py.
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
from offline_router import metric, wait_for
from residency_cli import run_cli
from router_server import RouterProcess
from vllm_server import REPO_ROOT

from residency.index import IndexOptions, build_index
from residency.query_log import read_query_log
from residency.tokenizer import LocalTokenizer

CORPUS = REPO_ROOT / "residency" / "data" / "corpora" / "harbor-lights" / "docs"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GOOD_CHAT = {"messages": [{"role": "user", "content": "灯台は？"}], "max_tokens": 1}
ALLOWED_ORIGIN = "https://app.example"
TORN = b'{"query": "torn by a crash", "cou'
GUARD_ARGS = (
    "--no-warm",
    "--retriever",
    "bm25",
    "--max-body-bytes",
    "4096",
    "--max-concurrent",
    "2",
    "--header-timeout",
    "1",
    "--body-timeout",
    "1",
    "--allow-origin",
    ALLOWED_ORIGIN,
    "--max-question-chars",
    "40",
)


@pytest.fixture(scope="module")
def offline_plan(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    """A plan made without a server (BM25 index of the sample corpus, 8K context)."""
    root = tmp_path_factory.mktemp("guard")
    build_index(
        CORPUS, root / "index", IndexOptions(dense=False), LocalTokenizer(tiny_tokenizer_dir), None
    )
    out = root / "plan.json"
    done = run_cli(
        "plan", "--index", str(root / "index"), "--max-model-len", "8192", "-o", str(out)
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def router(
    offline_plan: Path, dead_upstream: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RouterProcess]:
    proc = RouterProcess(
        offline_plan, [dead_upstream], tmp_path_factory.mktemp("router"), GUARD_ARGS
    )
    proc.query_log.write_bytes(b'{"query": "before", "count": 1}\n' + TORN)  # a crash's tail
    with proc.start(require_healthy=False):
        yield proc


def post(router: RouterProcess, path: str, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(f"{router.base_url}{path}", json=body, timeout=30, **kw)


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The OpenAI error object, checked for shape."""
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert "\n" not in error["message"]
    return error  # type: ignore[no-any-return]


def chat_with(**fields: Any) -> dict[str, Any]:
    return {**GOOD_CHAT, **fields}


REFUSED = [
    pytest.param(CHAT, chat_with(stream="false"), "stream", id="stream-string"),
    pytest.param(CHAT, chat_with(stream=1), "stream", id="stream-number"),
    pytest.param(
        CHAT,
        chat_with(stream=True, stream_options="x"),
        "stream_options",
        id="stream-options-string",
    ),
    pytest.param(
        CHAT, chat_with(stream=True, stream_options=[1]), "stream_options", id="stream-options-list"
    ),
    pytest.param(
        CHAT,
        chat_with(stream=True, stream_options={"include_usage": "yes"}),
        "stream_options",
        id="include-usage-string",
    ),
    pytest.param(
        CHAT,
        {"messages": [None, 5, {"role": "user", "content": "q"}]},
        "messages",
        id="messages-not-objects",
    ),
    pytest.param(
        CHAT,
        {"messages": [{"role": "wizard", "content": "q"}]},
        "messages",
        id="messages-unknown-role",
    ),
    pytest.param(
        CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages", id="content-number"
    ),
    pytest.param(CHAT, {"messages": "q"}, "messages", id="messages-string"),
    pytest.param(CHAT, chat_with(model=5), "model", id="model-number"),
    pytest.param(CHAT, chat_with(return_token_ids=True), "return_token_ids", id="token-ids"),
    pytest.param(CHAT, chat_with(echo=True), "echo", id="chat-echo"),
    pytest.param(CHAT, chat_with(cache_salt="x"), "cache_salt", id="cache-salt"),
    pytest.param(
        CHAT, chat_with(chat_template="{{ messages }}"), "chat_template", id="chat-template"
    ),
    pytest.param(
        COMPLETIONS, {"prompt": "q", "echo": True, "logprobs": 1}, "echo", id="completions-echo"
    ),
    pytest.param(
        COMPLETIONS,
        {"prompt": "q", "prompt_logprobs": 0},
        "prompt_logprobs",
        id="prompt-logprobs-zero",
    ),
    pytest.param(
        COMPLETIONS,
        {"prompt": "q", "logprobs": 1, "return_tokens_as_token_ids": True},
        "return_tokens_as_token_ids",
        id="tokens-as-ids",
    ),
    pytest.param(COMPLETIONS, {"prompt": ["a", "b"]}, "prompt", id="prompt-batch"),
    pytest.param(COMPLETIONS, {"prompt": [1, 2]}, "prompt", id="prompt-token-ids"),
]


@pytest.mark.parametrize(("path", "body", "param"), REFUSED)
def test_malformed_and_prompt_reading_requests_are_400s_naming_the_field(
    router: RouterProcess, path: str, body: dict[str, Any], param: str
) -> None:
    response = post(router, path, body)
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert param in error["message"]


PASSED = [
    pytest.param(CHAT, chat_with(stream=False, echo=False, top_k=5, min_p=0.1), id="sampling"),
    pytest.param(
        CHAT, chat_with(stream=True, stream_options={"include_usage": True}), id="stream-usage"
    ),
    pytest.param(
        CHAT,
        chat_with(messages=[{"role": "user", "content": [{"type": "text", "text": "q"}]}]),
        id="content-parts",
    ),
    pytest.param(
        COMPLETIONS,
        {"prompt": ["q"], "logprobs": 1, "prompt_logprobs": None},
        id="completions-logprobs",
    ),
]


@pytest.mark.parametrize(("path", "body"), PASSED)
def test_valid_requests_pass_every_check_to_the_upstream(
    router: RouterProcess, path: str, body: dict[str, Any]
) -> None:
    response = post(router, path, body)
    assert response.status_code == 503, response.text  # got as far as picking an upstream
    assert error_of(response)["code"] == "upstream_unavailable"


def test_prompt_readback_passes_when_the_operator_allows_it(
    offline_plan: Path, dead_upstream: str, tmp_path: Path
) -> None:
    args = ("--no-warm", "--retriever", "bm25", "--allow-prompt-readback")
    with RouterProcess(offline_plan, [dead_upstream], tmp_path, args).start(
        require_healthy=False
    ) as proc:
        response = post(proc, COMPLETIONS, {"prompt": "q", "echo": True, "logprobs": 1})
    assert response.status_code == 503, response.text


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"),
        ({"Content-Type": ""}, 415, "unsupported_media_type"),
        ({"Origin": "https://evil.example"}, 403, "origin_not_allowed"),
        ({"Origin": "null"}, 403, "origin_not_allowed"),
        ({"Host": "rebound.evil.example"}, 403, "host_not_allowed"),
        ({"Content-Type": "application/json; charset=utf-8"}, 503, "upstream_unavailable"),
        ({"Origin": ALLOWED_ORIGIN}, 503, "upstream_unavailable"),
        ({"Host": "localhost"}, 503, "upstream_unavailable"),
    ],
    ids=[
        "text-plain",
        "form",
        "no-type",
        "origin",
        "null-origin",
        "host",
        "json-charset",
        "allowed-origin",
        "localhost",
    ],
)
def test_browser_requests_need_json_an_allowed_origin_and_this_host(
    router: RouterProcess, headers: dict[str, str], status: int, code: str
) -> None:
    sent = {"Content-Type": "application/json", **headers}
    response = httpx.post(
        f"{router.base_url}{CHAT}", content=json.dumps(GOOD_CHAT), headers=sent, timeout=30
    )
    assert response.status_code == status, response.text
    assert error_of(response)["code"] == code


def test_an_allowed_origin_gets_its_cors_preflight(router: RouterProcess) -> None:
    preflight = httpx.options(
        f"{router.base_url}{CHAT}",
        headers={
            "Origin": ALLOWED_ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
        timeout=30,
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ALLOWED_ORIGIN


def test_bodies_over_the_limit_are_413_declared_or_not(router: RouterProcess) -> None:
    big = chat_with(messages=[{"role": "user", "content": "x" * 5000}])
    declared = post(router, CHAT, big)
    assert declared.status_code == 413
    assert error_of(declared)["code"] == "body_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer
        data = json.dumps(big).encode()
        for i in range(0, len(data), 1000):
            yield data[i : i + 1000]

    chunked = httpx.post(
        f"{router.base_url}{CHAT}",
        content=chunks(),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert chunked.status_code == 413
    assert error_of(chunked)["code"] == "body_too_large"


def half_sent(
    router: RouterProcess, body_bytes: int = 10, headers_done: bool = True
) -> socket.socket:
    """A connection that sends its headers (or part of them) and part of its body, then waits."""
    sock = socket.create_connection(("127.0.0.1", router.port), timeout=60)
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{router.port}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n"
    )
    if not headers_done:
        sock.sendall(head.encode()[:40])
        return sock
    sock.sendall(head.encode() + b"\r\n" + b"{" + b" " * (body_bytes - 1))
    return sock


def read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def test_half_sent_bodies_and_headers_time_out_and_leave_no_traceback(
    router: RouterProcess,
) -> None:
    # --body-timeout 1 and --header-timeout 1 answer (or close) these; a router that did not
    # would leave the reads to the sockets' own 60 s timeout, which fails the test.
    with half_sent(router) as body_sock, half_sent(router, headers_done=False) as head_sock:
        body_answer = read_all(body_sock)
        head_answer = read_all(head_sock)
    assert body_answer.startswith(b"HTTP/1.1 408"), body_answer[:200]
    assert b'"code":"body_timeout"' in body_answer
    assert head_answer == b""  # closed without an answer
    for _ in range(5):  # clients that drop mid-body
        half_sent(router).close()
    # Every dropped body has been let go of (the router's own gauge), then: still serving.
    wait_for(
        lambda: metric(router.base_url, "residency_router_bodies_receiving") == 0,
        "the dropped bodies to be let go of",
    )
    assert post(router, CHAT, GOOD_CHAT).status_code == 503  # still serving
    log = router.log_text()
    assert "Traceback" not in log
    assert "ClientDisconnect" not in log


def test_a_torn_last_log_line_does_not_swallow_the_next_record(router: RouterProcess) -> None:
    question = "霧信号について。" + "詳しく" * 40  # longer than --max-question-chars 40
    assert (
        post(router, CHAT, chat_with(messages=[{"role": "user", "content": question}])).status_code
        == 503
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        read = read_query_log(router.query_log)
        if len(read.entries) >= 2:
            break
        time.sleep(0.05)
    lines = router.query_log.read_bytes().splitlines()
    assert lines[1] == TORN  # kept as it was, on its own line
    assert len(read.skipped) == 1
    assert ":2:" in read.skipped[0]
    logged = [e.query for e in read.entries]
    assert logged[0] == "before"
    assert question[:40] in logged  # the first --max-question-chars characters
    assert all(len(q) <= 40 for q in logged)


def test_an_upstream_answer_without_done_keeps_the_upstream_in_rotation(
    offline_plan: Path, tmp_path: Path
) -> None:
    """Reproduction 1's other half: an upstream that answers a stream with plain JSON (what
    vLLM did for `"stream": "false"`) ends that client's stream with an error, and nothing else:
    health comes from health checks and transport failures only."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    instant = REPO_ROOT / "benchmarks" / "instant_upstream.py"
    upstream = subprocess.Popen([sys.executable, str(instant), str(port)])
    try:
        args = ("--no-warm", "--retriever", "bm25")
        with RouterProcess(offline_plan, [f"http://127.0.0.1:{port}"], tmp_path, args) as proc:
            for _ in range(3):
                streamed = post(proc, CHAT, chat_with(stream=True))
                assert streamed.status_code == 200
                events = [e for e in streamed.text.split("\n\n") if e]
                assert events[-1] == "data: [DONE]"
                assert json.loads(events[-2][6:])["error"]["type"] == "server_error"
                health = httpx.get(f"{proc.base_url}/health", timeout=10).json()
                assert health["upstreams_usable"] == 1
            assert post(proc, CHAT, GOOD_CHAT).status_code == 200  # not a 503
            outcomes = [json.loads(x)["outcome"] for x in proc.query_log.read_text().splitlines()]
            assert outcomes[:3] == ["upstream_error"] * 3
            assert "out of rotation" not in proc.log_text()
    finally:
        upstream.terminate()
        upstream.wait(10)


def test_a_stream_whose_done_was_sent_is_logged_ok_when_the_client_hangs_up(
    offline_plan: Path, tmp_path: Path
) -> None:
    """Reproduction 6: the client has `[DONE]` and hangs up before the upstream ends its
    response (here it holds it open for 2 s): a complete stream, not a 499 disconnect."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    holder = Path(__file__).parent / "done_then_hold_upstream.py"
    upstream = subprocess.Popen([sys.executable, str(holder), str(port)])
    try:
        args = ("--no-warm", "--retriever", "bm25")
        with RouterProcess(offline_plan, [f"http://127.0.0.1:{port}"], tmp_path, args) as proc:
            body = json.dumps(chat_with(stream=True)).encode()
            with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as sock:
                head = (
                    f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{proc.port}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                )
                sock.sendall(head.encode() + body)
                seen = b""
                while b"data: [DONE]" not in seen:
                    chunk = sock.recv(65536)
                    assert chunk, seen
                    seen += chunk
            deadline = time.monotonic() + 10  # logged once the router's stream ends
            while not proc.query_log.exists() or not proc.query_log.read_text():
                assert time.monotonic() < deadline
                time.sleep(0.1)
            record = json.loads(proc.query_log.read_text().splitlines()[-1])
    finally:
        upstream.terminate()
        upstream.wait(10)
    assert (record["outcome"], record["status_code"]) == ("ok", 200)


def test_an_upstream_late_to_health_probes_leaves_rotation_only_after_three_in_a_row(
    offline_plan: Path, tmp_path: Path
) -> None:
    """vLLM answers /health from the loop that streams every token: on a loaded host one probe
    answered late is a busy server, not a dead one (the CI failure of 2026-12-05: a healthy
    upstream left rotation while it streamed two answers, and the next request got a 503)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flag = tmp_path / "slow"
    script = Path(__file__).parent / "slow_health_upstream.py"
    upstream = subprocess.Popen([sys.executable, str(script), str(port), str(flag)])

    def usable() -> int:
        health = httpx.get(f"{proc.base_url}/health", timeout=10).json()
        return int(health["upstreams_usable"])

    try:
        args = ("--no-warm", "--retriever", "bm25", "--health-interval", "0.5")
        with RouterProcess(offline_plan, [f"http://127.0.0.1:{port}"], tmp_path, args) as proc:
            assert usable() == 1
            flag.touch()
            # Two probes in a row unanswered: the log says so, and the upstream is still in
            # rotation (a third needs another 5 s timeout).
            wait_for(lambda: "(2 of 3)" in proc.log_text(), "two unanswered probes", 120)
            assert usable() == 1, proc.log_tail()
            wait_for(lambda: usable() == 0, "the third unanswered probe to take it out", 120)
            assert "(3 of 3)" in proc.log_text() or "is down" in proc.log_text()
            flag.unlink()
            wait_for(lambda: usable() == 1, "the upstream to answer again and rejoin", 120)
            log = proc.log_text()
    finally:
        upstream.terminate()
        upstream.wait(10)
    assert "answered no health probe in 5 s (1 of 3)" in log
    assert "answered no health probe in 5 s (2 of 3)" in log
    assert log.count("is down") == 1  # left once
    assert log.count("is up") == 2  # joined, re-joined


def test_two_host_headers_are_a_400_and_a_compressed_body_a_415(router: RouterProcess) -> None:
    body = json.dumps(GOOD_CHAT).encode()
    with socket.create_connection(("127.0.0.1", router.port), timeout=30) as sock:
        sock.sendall(
            f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{router.port}\r\nHost: evil.example\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"more than one Host header" in answer
    gzipped = httpx.post(
        f"{router.base_url}{CHAT}",
        content=body,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        timeout=30,
    )
    assert gzipped.status_code == 415
    assert "Content-Encoding 'gzip'" in error_of(gzipped)["message"]
