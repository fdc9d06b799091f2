"""Request validation and the Host rule as pure functions (the router-level checks are in
test_serve_guard.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from residency.serve.guard import allowed_hosts, host_name
from residency.serve.validation import RequestError, parse_request


def raw(body: Any) -> bytes:
    return json.dumps(body).encode()


def test_a_valid_chat_request_keeps_its_messages_and_forwards_allowlisted_fields_only() -> None:
    body = {
        "model": "m", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": " q "}],
        "temperature": 0, "top_k": 3, "echo": False, "prompt_logprobs": None,
    }  # fmt: skip
    req = parse_request(raw(body), "chat", allow_readback=False)
    assert req.messages == body["messages"]
    assert req.question == "q"
    assert (req.stream, req.client_usage) == (True, True)
    assert "messages" not in req.body
    assert req.body["top_k"] == 3


def test_a_completions_prompt_becomes_one_user_message() -> None:
    req = parse_request(raw({"prompt": ["何？"]}), "completions", allow_readback=False)
    assert req.messages == [{"role": "user", "content": "何？"}]
    assert (req.stream, req.client_usage) == (False, False)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"messages": [{"role": "user", "content": "q"}], "stream": "false"}, 400, "stream"),
        ({"messages": [{"role": "user", "content": "q"}], "stream": 0}, 400, "stream"),
        ({"messages": [{"role": "user", "content": "q"}], "logit_bias2": {}}, 400, "logit_bias2"),
        ({"messages": [{"role": "user", "content": "q"}], "prompt_logprobs": 0}, 400,
         "prompt_logprobs"),
        ({"messages": [{"role": "user", "content": "q"}, 3]}, 400, "messages"),
        ({"messages": [{"role": "assistant", "content": "a"}]}, 400, "messages"),
        ([1, 2], 400, None),
    ],
    ids=["stream-str", "stream-int", "unknown", "prompt-logprobs-0", "non-object-message",
         "no-user-turn", "not-an-object"],
)  # fmt: skip
def test_refusals_name_the_field(body: Any, status: int, param: str | None) -> None:
    with pytest.raises(RequestError) as caught:
        parse_request(raw(body), "chat", allow_readback=False)
    assert caught.value.status == status
    assert caught.value.param == param


def test_readback_passes_when_allowed() -> None:
    body = {"prompt": "q", "echo": True, "logprobs": 1}
    assert parse_request(raw(body), "completions", allow_readback=True).body["echo"] is True


@pytest.mark.parametrize(
    ("header", "name"),
    [("127.0.0.1:8100", "127.0.0.1"), ("[::1]:8100", "::1"), ("LocalHost", "localhost"),
     ("example.com:80", "example.com"), ("::1", "::1")],
)  # fmt: skip
def test_host_name_drops_the_port(header: str, name: str) -> None:
    assert host_name(header) == name


def test_allowed_hosts_for_loopback_wildcard_and_named_binds() -> None:
    assert allowed_hosts("127.0.0.1", ()) == {"127.0.0.1", "localhost", "::1"}
    assert allowed_hosts("0.0.0.0", ("x",)) is None  # every interface: --api-key guards it
    assert allowed_hosts("10.0.0.5", ("Proxy.Example",)) == {"10.0.0.5", "proxy.example"}
