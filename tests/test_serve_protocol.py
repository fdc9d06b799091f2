"""The header read timeout on both of uvicorn's HTTP protocols, in a real uvicorn server: a
client trickling its headers is cut off, a whole request is served, and a request taking longer
than the timeout is not cut (the timer only runs while headers are awaited)."""

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
from residency.serve.protocol import header_timeout_protocol

TIMEOUT_S = 0.5


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
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
        http=header_timeout_protocol(TIMEOUT_S, request.param),
    )  # fmt: skip
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
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        assert sock.recv(4096) == b""  # closed, nothing answered
        assert time.monotonic() - started < TIMEOUT_S + 2


@pytest.mark.parametrize("path", ["/", "/slow"])
def test_whole_requests_are_served_even_past_the_timeout(port: int, path: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for _ in range(2):  # keep-alive: the second request after the first's answer
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert answer(sock).startswith(b"HTTP/1.1 200")
