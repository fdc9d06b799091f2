"""The router's pure parts: prompt assembly, SSE reassembly, settings, the balancer's choice."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from residency_cli import run_cli

from residency.cli import main
from residency.context.prompt import (
    CLIENT_SYSTEM_HEADER,
    QUESTION_HEADER,
    RETRIEVED_HEADER,
    ContextBlock,
    assemble_messages,
    question_of,
)
from residency.errors import ConfigError
from residency.serve.settings import ServeSettings, is_loopback
from residency.serve.telemetry import RouterMetrics
from residency.serve.upstreams import NoUpstreamError, UpstreamPool
from residency.vllm_client import open_session
from residency.vllm_client.sse import DONE, EventSplitter, error_event, event_json, usage_of

PREFIX = "instructions\n\n# 参照文書\n\n[id: a] A\ntext\n"
EMPTY = ContextBlock(period_line=None, passages=())


def test_resident_route_sends_the_prefix_then_the_question_unchanged() -> None:
    out = assemble_messages([{"role": "user", "content": "質問？"}], PREFIX, EMPTY)
    assert out == [
        {"role": "system", "content": PREFIX},
        {"role": "user", "content": "質問？"},
    ]


def test_context_goes_into_the_last_user_turn_after_the_prefix() -> None:
    block = ContextBlock(period_line="Period: 2025-01-01 〜 2025-01-07", passages=("[id: x] X\nx",))
    messages = [
        {"role": "system", "content": "丁寧に答えて"},
        {"role": "user", "content": "前の質問"},
        {"role": "assistant", "content": "前の答え"},
        {"role": "user", "content": "正月に何があった？"},
    ]
    out = assemble_messages(messages, PREFIX, block)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"] == PREFIX  # the client's system message never displaces it
    assert out[1]["content"] == "前の質問"  # earlier turns are untouched
    last = out[-1]["content"]
    assert last.index(CLIENT_SYSTEM_HEADER) < last.index("丁寧に答えて")
    assert last.index("# Period: 2025-01-01") < last.index(RETRIEVED_HEADER)
    assert last.index("[id: x] X\nx") < last.index(QUESTION_HEADER)
    assert last.endswith(f"{QUESTION_HEADER}\n正月に何があった？")
    assert messages[-1]["content"] == "正月に何があった？"  # the request is not mutated


def test_content_parts_keep_their_parts_after_a_text_context_part() -> None:
    parts = [{"type": "text", "text": "これは何？"}]
    out = assemble_messages(
        [{"role": "user", "content": parts}], PREFIX, ContextBlock(None, ("[id: y] Y\ny",))
    )
    assert out[1]["content"][0]["type"] == "text"
    assert out[1]["content"][0]["text"].endswith(QUESTION_HEADER)
    assert out[1]["content"][1:] == parts


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        pytest.param([{"role": "user", "content": " 質問 "}], "質問", id="string"),
        pytest.param(
            [{"role": "user", "content": [{"type": "text", "text": "部分"}]}], "部分", id="parts"
        ),
        pytest.param(
            [
                {"role": "user", "content": "1"},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "2"},
            ],
            "2",
            id="last-user-turn",
        ),
    ],
)
def test_question_is_the_last_user_message(
    messages: list[dict[str, object]], expected: str
) -> None:
    assert question_of(messages) == expected


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param([{"role": "system", "content": "x"}], id="no-user"),
        pytest.param([{"role": "user", "content": "  "}], id="blank"),
    ],
)
def test_nothing_to_answer_is_a_config_error(messages: list[dict[str, object]]) -> None:
    with pytest.raises(ConfigError):
        question_of(messages)


def test_sse_events_are_reassembled_across_arbitrary_chunk_boundaries() -> None:
    stream = b'data: {"a": 1}\n\ndata: {"b": 2}\n\n' + DONE
    for cut in range(1, len(stream)):
        splitter = EventSplitter()
        events = splitter.feed(stream[:cut]) + splitter.feed(stream[cut:])
        assert events == [b'data: {"a": 1}\n\n', b'data: {"b": 2}\n\n', DONE]
        assert splitter.rest() == b""


def test_usage_only_chunk_is_recognised_and_content_chunks_are_not() -> None:
    usage_only = (
        b'data: {"choices": [], "usage": {"prompt_tokens": 9, '
        b'"prompt_tokens_details": {"cached_tokens": 8}}}\n\n'
    )
    content = b'data: {"choices": [{"delta": {"content": "x"}}], "usage": null}\n\n'
    assert usage_of(usage_only) == (
        {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 8}},
        True,
    )
    assert usage_of(content) == (None, False)
    assert usage_of(DONE) == (None, False)


def test_error_event_is_openai_shaped() -> None:
    body = event_json(error_event("boom"))
    assert body == {"error": {"message": "boom", "type": "server_error", "code": 502}}


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("127.0.0.2", True),
        ("0.0.0.0", False),
        ("192.168.1.5", False),
        ("example.org", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def _settings(**kw: object) -> ServeSettings:
    base: dict[str, object] = {"plan": "plan.json", "upstreams": ("http://x",), "log": None}
    return ServeSettings.model_validate({**base, **kw})


def test_binding_beyond_loopback_requires_an_api_key() -> None:
    with pytest.raises(ValidationError, match="--api-key"):
        _settings(host="0.0.0.0")
    assert _settings(host="0.0.0.0", api_key="s3cret-key").host == "0.0.0.0"


def test_pool_picks_the_least_outstanding_usable_upstream() -> None:
    asyncio.run(_pool_scenario())


async def _pool_scenario() -> None:
    async with open_session(5.0) as http:
        pool = UpstreamPool(["http://a", "http://b/v1", "http://c"], http, RouterMetrics(), 5.0)
        a, b, c = pool.upstreams
        assert b.url == "http://b"  # a trailing /v1 is not part of the base URL
        with pytest.raises(NoUpstreamError):
            pool.pick()
        for up in (a, b, c):
            up.healthy = True
        c.excluded = "serves another model"
        await pool.acquire(a)
        assert pool.pick() is b
        await pool.acquire(b)
        await pool.acquire(b)
        assert pool.pick() is a  # 1 in flight beats 2
        assert pool.pick(exclude=[a]) is b
        pool.release(b)
        pool.release(b)
        pool.mark_down(a)
        assert pool.pick() is b
        assert not c.usable


def _serve_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("serve", *args, timeout=120)


def test_a_taken_port_and_a_missing_plan_are_one_line_each(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        taken = _serve_cli("--plan", str(tmp_path / "plan.json"), "--port", str(port))
    assert taken.returncode == 1
    assert taken.stderr.strip() == (
        f"error: --host 127.0.0.1 --port {port}: cannot listen there (Address already in use); "
        "pick another --port or stop what holds it"
    )
    missing = _serve_cli("--plan", str(tmp_path / "plan.json"), "--port", "0")
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        f"error: --plan {tmp_path / 'plan.json'}: cannot read it (No such file or directory)"
    ]


def _serve_in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, list[str]]:
    """`residency serve ARGS` through the CLI's own entry point, in this process: exit status
    and stderr's lines (every case here is refused before anything is read or served)."""
    monkeypatch.setattr(sys, "argv", ["residency", "serve", "--plan", "absent.json", *args])
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.delenv("RESIDENCY_API_KEY", raising=False)
    with pytest.raises(SystemExit) as exited:
        main()
    code = exited.value.code
    assert isinstance(code, int)
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    ("args", "flag", "code"),
    [
        # Bounds live on the fields: bind refuses the value in one line (exit 1).
        (("--k", "101"), "--k", 1),
        (("--max-concurrent", "0"), "--max-concurrent", 1),
        (("--prune-threshold", "6", "--pruner-url", "http://h"), "--prune-threshold", 1),
        (("--retriever", "faiss"), "--retriever", 2),  # a Literal: click lists the choices
        (("--api-key", "short"), "--api-key", 1),  # min_length: refused by bind, one line
        (("--host", "0.0.0.0"), "--api-key", 1),  # exposure without a key
        # the flag as the command spells it, not the field's name (health_interval_s, url)
        (("--health-interval", "0"), "--health-interval", 1),
        (("--pruner-url", "ftp://h"), "--pruner-url", 1),
    ],
    ids=[
        "k-101",
        "max-concurrent-0",
        "prune-threshold-6",
        "retriever-faiss",
        "short-api-key",
        "exposed-host",
        "health-interval-0",
        "pruner-url-ftp",
    ],
)
def test_a_refused_serve_flag_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    flag: str,
    code: int,
) -> None:
    got, lines = _serve_in_process(monkeypatch, capsys, *args)
    assert got == code, lines
    naming = [line for line in lines if re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", line)]
    assert len(naming) == 1, lines
    assert "Traceback" not in "\n".join(lines)


def test_a_refused_secret_is_not_echoed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = _serve_in_process(monkeypatch, capsys, "--api-key", "s3cr3t")
    assert code == 1
    assert len(lines) == 1, lines
    assert "--api-key" in lines[0], lines
    assert "s3cr3t" not in lines[0]
