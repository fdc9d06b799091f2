"""Issue 35's reproductions that the router answers on its own, against a real `residency serve`
process whose only upstream is a closed port (a request that passes every check is a 503):
headers past --max-header-bytes or --max-headers (431, the connection closed before the rest is
read), bodies nested deeper than the router can re-encode (400 naming the field, no 500), a lone
surrogate (400 saying why), 100,000 unknown keys (a short error), and a chunked body past
--max-body-bytes (413, and the connection closed instead of read to its end).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from offline_router import metric, offline_plan
from router_server import RouterProcess

from residency.context.headers import ROUTE_HEADER
from residency.serve.validation import MAX_JSON_DEPTH

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MAX_BODY = 2 * 1024 * 1024  # room for 100,000 unknown keys
ARGS = ("--no-warm", "--retriever", "bm25", "--max-body-bytes", str(MAX_BODY))
QUESTION = b'"messages": [{"role": "user", "content": "q"}]'


@pytest.fixture(scope="module")
def router(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path
) -> Iterator[RouterProcess]:
    root = tmp_path_factory.mktemp("limits")
    plan = offline_plan(root, tiny_tokenizer_dir)
    with socket.socket() as closed:  # bound, never listening: every connection refused
        closed.bind(("127.0.0.1", 0))
        upstream = f"http://127.0.0.1:{closed.getsockname()[1]}"
        with RouterProcess(plan, [upstream], root, ARGS).start(require_healthy=False) as proc:
            yield proc


def connect(router: RouterProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", router.port), timeout=30)


def read_to_close(sock: socket.socket) -> bytes:
    """Everything the router sends before it closes the connection."""
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:  # the router closed with our bytes unread: done too
            return out
        if not chunk:
            return out
        out += chunk


def send_until_refused(sock: socket.socket, chunk: bytes, times: int) -> int:
    """How many of `times` sends of `chunk` went out before the router cut the connection."""
    for sent in range(times):
        try:
            sock.sendall(chunk)
        except (ConnectionResetError, BrokenPipeError):
            return sent
    return times


def error_of(raw_answer: bytes) -> dict[str, Any]:
    import json

    return json.loads(raw_answer.split(b"\r\n\r\n", 1)[1])["error"]  # type: ignore[no-any-return]


def post_raw(router: RouterProcess, body: bytes, path: str = CHAT) -> httpx.Response:
    return httpx.post(
        f"{router.base_url}{path}",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )


def test_a_60mb_header_is_refused_431_after_64_kib(router: RouterProcess) -> None:
    """Reproduction 1: the router answers 431 and closes once the head passes
    --max-header-bytes (64 KiB by default): the client cannot send its 60 MB."""
    with connect(router) as sock:
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{router.port}\r\nX-Big: ".encode())
        assert send_until_refused(sock, b"a" * 1_000_000, 60) < 60
        answer = read_to_close(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"connection: close" in answer.lower()
    error = error_of(answer)
    assert error["code"] == "request_header_fields_too_large"
    assert "--max-header-bytes 65536" in error["message"]
    assert httpx.get(f"{router.base_url}/health", timeout=10).status_code == 503  # serving


@pytest.mark.parametrize(
    ("header", "status"),
    [
        pytest.param(b"X-Big: " + b"a" * 60_000, b"503", id="60-kb"),
        pytest.param(b"X-Big: " + b"a" * 100_000, b"431", id="100-kb"),
        pytest.param(b"\r\n".join(b"X-%d: 1" % i for i in range(250)), b"503", id="250-fields"),
        pytest.param(b"\r\n".join(b"X-%d: 1" % i for i in range(260)), b"431", id="260-fields"),
    ],
)
def test_headers_within_the_limits_pass_and_past_them_get_431(
    router: RouterProcess, header: bytes, status: bytes
) -> None:
    body = b"{" + QUESTION + b"}"
    head = (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n\r\n" % (CHAT.encode(), router.port, len(body), header)
    )
    with connect(router) as sock:
        sock.sendall(head + body)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]


def nested(levels: int) -> bytes:
    return b"[" * levels + b'"x"' + b"]" * levels


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, 700, 1023])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_deep_json_is_a_400_naming_the_field_never_a_500(
    router: RouterProcess, path: str, levels: int
) -> None:
    """Reproduction 2: a `stop` of 254 nested arrays and deeper used to be a 500 (orjson
    parses 1,024 levels and encodes 254). `levels` counts the body's own object."""
    first = QUESTION if path == CHAT else b'"prompt": "q"'
    response = post_raw(router, b'{%s, "stop": %s}' % (first, nested(levels - 1)), path)
    if levels <= MAX_JSON_DEPTH:
        assert response.status_code == 503, response.text  # passed on (no upstream here)
        return
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("stop", "nested_too_deeply")
    assert str(MAX_JSON_DEPTH) in error["message"]
    assert "Traceback" not in router.log_text()


def test_a_lone_surrogate_is_a_400_that_says_why(router: RouterProcess) -> None:
    response = post_raw(router, b'{"messages": [{"role": "user", "content": "\\ud800"}]}')
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message.startswith("the request body is not valid JSON: ")
    assert "surrogate" in message


def test_a_hundred_thousand_unknown_keys_get_a_short_error(router: RouterProcess) -> None:
    keys = b", ".join(b'"k%06d": 1' % i for i in range(100_000))  # 1.3 MB
    response = post_raw(router, b"{" + QUESTION + b", " + keys + b"}")
    assert response.status_code == 400
    assert len(response.content) < 1000  # was 830 KB
    assert "and 99,995 more" in response.json()["error"]["message"]


def test_a_chunked_body_past_the_limit_is_413_and_the_connection_closed(
    router: RouterProcess,
) -> None:
    """Reproduction 7: after the 413 the router read on to the end of the body (21.7 MiB in
    10 s); now it closes the connection, so the client's next chunk goes nowhere."""
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{router.port}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n%s\r\n" % (MAX_BODY // 2, b" " * (MAX_BODY // 2))
    with connect(router) as sock:
        sock.sendall(head.encode() + b"1\r\n{\r\n" + chunk * 3)  # past --max-body-bytes
        answer = read_to_close(sock)  # ends: the router closed, not waiting for more
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"connection: close" in answer.lower()
    assert error_of(answer)["code"] == "body_too_large"


def test_errors_after_routing_carry_the_route_header(router: RouterProcess) -> None:
    for path, body in ((CHAT, b"{" + QUESTION + b"}"), (COMPLETIONS, b'{"prompt": "q"}')):
        response = post_raw(router, body, path)
        assert response.status_code == 503  # no upstream: after retrieval and routing
        assert response.headers[ROUTE_HEADER] in ("resident", "long_tail", "dated")
    assert metric(router.base_url, "residency_router_slots_in_use") == 0
