"""Request validation and the Host rule as pure functions (the router-level checks are in
test_serve_guard.py)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from residency.serve.guard import allowed_hosts, host_name
from residency.serve.validation import MAX_JSON_DEPTH, RequestError, parse_request

MAX_N = 8
Q = [{"role": "user", "content": "q"}]


def raw(body: Any) -> bytes:
    return json.dumps(body).encode()


def refusal(data: bytes, endpoint: str = "chat") -> RequestError:
    with pytest.raises(RequestError) as caught:
        parse_request(data, endpoint, allow_readback=False, max_n=MAX_N)  # type: ignore[arg-type]
    return caught.value


def nested(levels: int, kind: str) -> str:
    """JSON text of `levels` nested arrays or objects around a string."""
    if kind == "list":
        return "[" * levels + '"q"' + "]" * levels
    return '{"a":' * levels + '"q"' + "}" * levels


def test_a_valid_chat_request_keeps_its_messages_and_forwards_allowlisted_fields_only() -> None:
    body = {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": " q "}],
        "temperature": 0,
        "top_k": 3,
        "echo": False,
        "prompt_logprobs": None,
    }
    req = parse_request(raw(body), "chat", allow_readback=False, max_n=MAX_N)
    assert req.messages == body["messages"]
    assert req.question == "q"
    assert (req.stream, req.client_usage) == (True, True)
    assert "messages" not in req.body
    assert req.body["top_k"] == 3


def test_a_completions_prompt_becomes_one_user_message() -> None:
    req = parse_request(raw({"prompt": ["何？"]}), "completions", False, MAX_N)
    assert req.messages == [{"role": "user", "content": "何？"}]
    assert (req.stream, req.client_usage) == (False, False)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"messages": [{"role": "user", "content": "q"}], "stream": "false"}, 400, "stream"),
        ({"messages": [{"role": "user", "content": "q"}], "stream": 0}, 400, "stream"),
        ({"messages": [{"role": "user", "content": "q"}], "logit_bias2": {}}, 400, "logit_bias2"),
        (
            {"messages": [{"role": "user", "content": "q"}], "prompt_logprobs": 0},
            400,
            "prompt_logprobs",
        ),
        ({"messages": [{"role": "user", "content": "q"}, 3]}, 400, "messages"),
        ({"messages": [{"role": "assistant", "content": "a"}]}, 400, "messages"),
        ([1, 2], 400, None),
    ],
    ids=[
        "stream-str",
        "stream-int",
        "unknown",
        "prompt-logprobs-0",
        "non-object-message",
        "no-user-turn",
        "not-an-object",
    ],
)
def test_refusals_name_the_field(body: Any, status: int, param: str | None) -> None:
    refused = refusal(raw(body))
    assert refused.status == status
    assert refused.param == param


def test_readback_passes_when_allowed() -> None:
    body = {"prompt": "q", "echo": True, "logprobs": 1}
    assert parse_request(raw(body), "completions", True, MAX_N).body["echo"] is True


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("127.0.0.1:8100", "127.0.0.1"),
        ("[::1]:8100", "::1"),
        ("LocalHost", "localhost"),
        ("example.com:80", "example.com"),
        ("::1", "::1"),
    ],
)
def test_host_name_drops_the_port(header: str, name: str) -> None:
    assert host_name(header) == name


def test_allowed_hosts_for_loopback_wildcard_and_named_binds() -> None:
    assert allowed_hosts("127.0.0.1", ()) == {"127.0.0.1", "localhost", "::1"}
    assert allowed_hosts("0.0.0.0", ("x",)) is None  # every interface: --api-key guards it
    assert allowed_hosts("10.0.0.5", ("Proxy.Example",)) == {"10.0.0.5", "proxy.example"}


def test_max_json_depth_is_what_orjson_can_encode() -> None:
    """The oracle: orjson encodes MAX_JSON_DEPTH nested containers and refuses one more."""
    assert orjson.dumps(orjson.loads(nested(MAX_JSON_DEPTH, "list")))
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(orjson.loads(nested(MAX_JSON_DEPTH + 1, "list")))


@pytest.mark.parametrize("kind", ["list", "dict"])
@pytest.mark.parametrize("field", ["stop", "response_format", "logit_bias"])
def test_bodies_nested_past_what_can_be_reencoded_are_400s_naming_the_field(
    field: str, kind: str
) -> None:
    def body(levels: int) -> bytes:  # the body's own object is the first level
        return b'{"messages": %s, "%s": %s}' % (
            json.dumps(Q).encode(),
            field.encode(),
            nested(levels - 1, kind).encode(),
        )

    deepest = parse_request(body(MAX_JSON_DEPTH), "chat", False, MAX_N)
    assert orjson.dumps(deepest.body)  # what the router will re-encode for vLLM
    for levels in (MAX_JSON_DEPTH + 1, 600, 1024):  # orjson.loads takes up to 1,024
        refused = refusal(body(levels))
        assert (refused.status, refused.param, refused.code) == (400, field, "nested_too_deeply")
        assert f"'{field}'" in str(refused)
        assert str(MAX_JSON_DEPTH) in str(refused)


def test_a_json_schema_nested_130_levels_is_a_400() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(130):
        schema = {"type": "object", "properties": {"a": schema}}
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    refused = refusal(json.dumps({"messages": Q, "response_format": response_format}).encode())
    assert refused.param == "response_format"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "surrogate"),
        (b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}', "surrogate"),
        (b'{"messages": [', "line 1"),
        (b'{"temperature": NaN}', "line 1, column 17"),
    ],
    ids=["lone-surrogate-escape", "surrogate-utf8", "truncated", "nan"],
)
def test_invalid_json_says_why(data: bytes, reason: str) -> None:
    refused = refusal(data)
    assert str(refused).startswith("the request body is not valid JSON: ")
    assert reason in str(refused)


def test_a_hundred_thousand_unknown_keys_make_a_short_error() -> None:
    body = {"messages": Q, **{f"unknown_{i:06d}": 1 for i in range(100_000)}}
    refused = refusal(orjson.dumps(body))
    assert refused.param == "unknown_000000"
    assert len(str(refused)) < 500
    assert "and 99,995 more" in str(refused)
    long_name = refusal(orjson.dumps({"messages": Q, "x" * 100_000: 1}))
    assert len(str(long_name)) < 500
    assert len(long_name.param or "") < 100
    assert long_name.param


@pytest.mark.parametrize(
    ("extra", "fan_out"),
    [({}, 1), ({"n": 3}, 3), ({"n": 2, "best_of": 5}, 5), ({"n": MAX_N}, MAX_N), ({"n": 0}, 1)],
    ids=["none", "n", "best-of", "max-n", "n-zero-for-vllm"],
)
def test_fan_out_is_the_completions_asked_for(extra: dict[str, int], fan_out: int) -> None:
    assert parse_request(raw({"messages": Q, **extra}), "chat", False, MAX_N).fan_out == fan_out


@pytest.mark.parametrize("name", ["n", "best_of"])
def test_fan_out_past_max_n_is_a_400_naming_the_flag(name: str) -> None:
    refused = refusal(raw({"messages": Q, name: MAX_N + 1}))
    assert (refused.status, refused.param, refused.code) == (400, name, "too_many_completions")
    assert f"--max-n {MAX_N}" in str(refused)
    assert refusal(raw({"messages": Q, name: True})).param == name  # a boolean is no count
