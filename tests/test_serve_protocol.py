"""The limits on a request head on both of uvicorn's HTTP protocols, in a real uvicorn server:
a client trickling its headers is cut off, a whole request is served, and a request taking
longer than the timeout is not cut (the timer only runs while headers are awaited); a head past
--max-header-bytes or --max-headers is answered 431 before the client has sent it all, and the
next request on a connection starts its count from zero."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from residency.launcher import free_port
from residency.serve.protocol import header_limited_protocol
from residency.serve.settings import RequestLimits

TIMEOUT_S = 0.5
MAX_HEADER_BYTES = 4096
MAX_HEADERS = 16
LIMITS = RequestLimits(
    header_timeout_s=TIMEOUT_S, max_header_bytes=MAX_HEADER_BYTES, max_headers=MAX_HEADERS
)


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(TIMEOUT_S * 3)
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(params=["auto", "h11"])
def port(request: pytest.FixtureRequest) -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        http=header_limited_protocol(LIMITS, request.param),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    yield port
    server.should_exit = True
    thread.join(10)


def answer(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(4096):
        out += chunk
        if out.endswith(b"\r\n\r\nok"):
            break
    return out


def test_a_client_trickling_its_headers_is_cut_off(port: int) -> None:
    # Closed by the header timeout (0.5 s); without it the read would end at the socket's own
    # 60 s timeout with an exception, which fails the test.
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        assert sock.recv(4096) == b""  # closed, nothing answered


@pytest.mark.parametrize("path", ["/", "/slow"])
def test_whole_requests_are_served_even_past_the_timeout(port: int, path: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for _ in range(2):  # keep-alive: the second request after the first's answer
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert answer(sock).startswith(b"HTTP/1.1 200")


def head_of(fields: int, value_bytes: int) -> bytes:
    """A GET whose head holds `fields` header fields (Host included) of `value_bytes` each."""
    lines = [b"GET / HTTP/1.1", b"Host: x"]
    lines += [b"X-%d: %s" % (i, b"v" * value_bytes) for i in range(fields - 1)]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def send_until_refused(sock: socket.socket, chunk: bytes, times: int) -> int:
    """How many of `times` sends of `chunk` went out before the peer reset the connection."""
    for sent in range(times):
        try:
            sock.sendall(chunk)
        except (ConnectionResetError, BrokenPipeError):
            return sent
    return times


def refused_431(sock: socket.socket) -> bytes:
    """What the server sent before closing; asserts it is the JSON 431."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    assert out.startswith(b"HTTP/1.1 431 "), out[:200]
    assert b'"code":"request_header_fields_too_large"' in out
    return out


def test_a_head_past_max_header_bytes_is_refused_before_it_is_all_sent(port: int) -> None:
    """The client means to send a 100 MB header: the server answers 431 and closes after the
    first --max-header-bytes, so the client's send fails (the server read no further)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
        assert send_until_refused(sock, b"a" * 1_000_000, 100) < 100
        out = refused_431(sock)
    assert b"--max-header-bytes 4096" in out


@pytest.mark.parametrize(
    ("fields", "value_bytes", "status"),
    [
        pytest.param(MAX_HEADERS, 8, b"200", id="max-fields"),
        pytest.param(MAX_HEADERS + 1, 8, b"431", id="one-field-more"),
        pytest.param(2, MAX_HEADER_BYTES - 100, b"200", id="just-under-max-bytes"),
        pytest.param(2, MAX_HEADER_BYTES, b"431", id="past-max-bytes"),
    ],
)
def test_heads_at_the_limits_are_served_and_past_them_refused(
    port: int, fields: int, value_bytes: int, status: bytes
) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head_of(fields, value_bytes))
        if status == b"431":
            out = refused_431(sock)
            assert (b"--max-headers 16" in out) == (fields > MAX_HEADERS)
        else:
            assert answer(sock).startswith(b"HTTP/1.1 200")


def test_each_request_on_a_connection_has_its_own_head_budget(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for _ in range(3):  # 3 x 3 KB heads: over 4 KB together, each under it
            sock.sendall(head_of(2, 3000))
            assert answer(sock).startswith(b"HTTP/1.1 200")
