"""Client requests as the router accepts them: the fields it reads typed as the OpenAI API
defines them (pydantic, strict: `"stream": "false"` is not a boolean), every other field passed
to vLLM only when it is on an allowlist of sampling and output parameters, and the parameters
that would read the hidden prompt back refused by name unless the operator opts in.

    {"messages": [...], "stream": true, "temperature": 0, "top_k": 5}   -> served
    {"messages": [...], "stream": "false"}                              -> 400 'stream'
    {"prompt": "q", "echo": true, "logprobs": 1}                        -> 400 'echo'
    {"messages": [null, 5, {...}]}                                      -> 400 'messages.0'
    {"messages": [...], "n": 32}                                        -> 400 'n' (--max-n)
    {"messages": [...], "stop": [[[...254 levels...]]]}                 -> 400 'stop'

Every body the JSON parser accepts is either refused here or can be re-encoded for vLLM:
orjson parses 1,024 levels of nesting but encodes at most MAX_JSON_DEPTH.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from residency.context.prompt import question_of
from residency.errors import ConfigError
from residency.serve.errors import error_response
from residency.vllm_client.endpoints import Generation

# Parameters that return prompt text, prompt token ids or prompt logprobs: with them a client
# reads the resident prefix and the retrieved passages (and forces an uncached prefill).
READBACK_PARAMS = frozenset(
    {"echo", "prompt_logprobs", "return_token_ids", "return_tokens_as_token_ids"}
)

# Passed to vLLM as the client sent them (vLLM validates their values and answers 400 itself).
# Left out on purpose: what changes how the prefix is rendered or cached (chat_template,
# add_generation_prompt, continue_final_message, add_special_tokens, truncate_prompt_tokens,
# cache_salt, documents, mm_processor_kwargs), what runs server-side code or transfers state
# (logits_processors, vllm_xargs, kv_transfer_params) and the read-back parameters above.
OPENAI_PARAMS = """
    frequency_penalty presence_penalty logit_bias logprobs top_logprobs max_tokens
    max_completion_tokens n best_of seed stop temperature top_p response_format tools
    tool_choice parallel_tool_calls user reasoning_effort
"""
VLLM_PARAMS = """
    top_k min_p repetition_penalty length_penalty stop_token_ids include_stop_str_in_output
    ignore_eos min_tokens skip_special_tokens spaces_between_special_tokens bad_words
    allowed_token_ids use_beam_search structured_outputs guided_json guided_regex guided_choice
    guided_grammar guided_decoding_backend guided_whitespace_pattern priority request_id
    chat_template_kwargs
"""  # vLLM's sampling and structured output
SAMPLING_PARAMS = frozenset(OPENAI_PARAMS.split() + VLLM_PARAMS.split())

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class ContentPart(BaseModel):
    """One part of a message's content list (text, or a part vLLM judges)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="allow")

    type: str = Field(min_length=1, max_length=64, description="'text', 'image_url', ...")
    text: str | None = Field(default=None, description="The text of a 'text' part.")


class ChatMessage(BaseModel):
    """One chat message: a role and its content (tool fields pass through)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="allow")

    role: Role = Field(description="Who speaks.")
    content: str | list[ContentPart] | None = Field(default=None, description="Text or parts.")


class StreamOptions(BaseModel):
    """`stream_options` as OpenAI and vLLM define it."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    include_usage: bool | None = Field(default=None, description="Add a final usage chunk.")
    continuous_usage_stats: bool | None = Field(default=None, description="Usage per chunk.")
    include_obfuscation: bool | None = Field(default=None, description="OpenAI only; ignored.")


class _Common(BaseModel):
    """The fields the router reads on both endpoints (the others are checked by name)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    model: str | None = Field(default=None, min_length=1, max_length=512, description="Model.")
    stream: bool | None = Field(default=None, description="Stream server-sent events.")
    stream_options: StreamOptions | None = Field(default=None, description="Stream options.")
    # Bounds below 1 are vLLM's to refuse; the router reads them for --max-n and the budget.
    n: int | None = Field(default=None, description="Completions to generate.")
    best_of: int | None = Field(default=None, description="Candidates generated (vLLM).")


class ChatRequest(_Common):
    """/v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=10_000, description="Turns.")


class CompletionRequest(_Common):
    """/v1/completions: one prompt string (the router retrieves for a question)."""

    prompt: str | list[str] = Field(description="The question, or a list holding it alone.")


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """A validated request: what the router reads, and the body it forwards (sans prompt)."""

    messages: list[dict[str, Any]]  # as the client sent them (a prompt: one user message)
    question: str  # the last user message's text, whole
    stream: bool
    client_usage: bool  # the client asked for the usage chunk itself
    body: dict[str, Any]  # model, stream, stream_options and allowlisted parameters
    fan_out: int  # completions vLLM generates for it: max(n, best_of, 1)


class RequestError(Exception):
    """A request the router refuses: an OpenAI-shaped 4xx."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.param = param
        self.close = close  # the body was not read to its end: close rather than read on

    def response(self) -> Response:
        """The error as the client gets it."""
        kind = "rate_limit_error" if self.status == 429 else "invalid_request_error"
        response = error_response(self.status, str(self), kind, self.code, self.param)
        if self.close:  # uvicorn closes the connection after the answer
            response.headers["Connection"] = "close"
        return response


_READ = {"messages", "prompt", "model", "stream", "stream_options"}
# Containers nested in one body, its own object included: orjson.dumps raises "Recursion limit
# reached" at 255 (orjson.loads takes 1,024), and the router re-encodes every body it forwards.
MAX_JSON_DEPTH = 254
# Unknown parameters named in a refusal, and characters of each: 100,000 of them must not
# make a megabyte of error.
LISTED_NAMES = 5
NAME_CHARS = 64


def parse_request(
    raw: bytes, endpoint: Generation, allow_readback: bool, max_n: int
) -> ClientRequest:
    """The request in `raw` (a JSON body), or `RequestError` naming what is wrong."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, f"the request body is not valid JSON: {_reason(exc)}") from None
    if not isinstance(data, dict):
        raise RequestError(400, "the request body must be a JSON object")
    _check_depth(data)
    asked = (k for k in READBACK_PARAMS & data.keys() if data[k] is not None)
    readback = sorted(k for k in asked if data[k] is not False)
    if readback and not allow_readback:
        raise RequestError(
            400,
            f"{', '.join(readback)}: the router does not return prompt text, tokens or "
            "logprobs (the operator can allow it with --allow-prompt-readback)",
            "prompt_readback_refused",
            readback[0],
        )
    unknown = sorted(data.keys() - _READ - SAMPLING_PARAMS - READBACK_PARAMS)
    if unknown:
        raise RequestError(
            400,
            f"unsupported parameter {_names(unknown)}: the router passes on sampling and "
            "output parameters only",
            "unsupported_parameter",
            _cut(unknown[0]),
        )
    schema = ChatRequest if endpoint == "chat" else CompletionRequest
    try:
        parsed = schema.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc) from None
    if isinstance(parsed, ChatRequest):
        messages: list[dict[str, Any]] = data["messages"]
    else:
        prompt = parsed.prompt if isinstance(parsed.prompt, str) else _one(parsed.prompt)
        messages = [{"role": "user", "content": prompt}]
    try:
        question = question_of(messages)
    except ConfigError as exc:
        raise RequestError(400, str(exc), param="messages") from None
    stream = bool(parsed.stream)
    options = parsed.stream_options
    body = {k: v for k, v in data.items() if k not in ("messages", "prompt")}
    return ClientRequest(
        messages=messages,
        question=question,
        stream=stream,
        client_usage=bool(options is not None and options.include_usage),
        body=body,
        fan_out=_fan_out(parsed, max_n),
    )


def _fan_out(parsed: _Common, max_n: int) -> int:
    """Completions the request makes vLLM generate; past --max-n a `RequestError`."""
    for name in ("n", "best_of"):
        value = getattr(parsed, name)
        if value is not None and value > max_n:
            raise RequestError(
                400,
                f"'{name}' {value}: at most --max-n {max_n} completions per request",
                "too_many_completions",
                name,
            )
    return max(parsed.n or 1, parsed.best_of or 1, 1)


def _reason(exc: orjson.JSONDecodeError) -> str:
    """orjson's reason and where: 'no low surrogate in string at line 1, column 8'."""
    return f"{exc.msg[:200]} at line {exc.lineno}, column {exc.colno}"


def _check_depth(data: dict[str, Any]) -> None:
    """Refuse a body the router could not re-encode, naming the top-level field."""
    try:
        orjson.dumps(data)  # C speed; the walk below runs only for a body that fails
    except orjson.JSONEncodeError as exc:
        field = _too_deep(data)
        if field is None:  # pragma: no cover - orjson.loads output fails only on depth
            raise RequestError(400, f"the request body cannot be passed on: {exc}") from None
        raise RequestError(
            400,
            f"'{_cut(field)}' is nested too deeply: the router passes on bodies nested at "
            f"most {MAX_JSON_DEPTH} levels of arrays and objects (the body's own included)",
            "nested_too_deeply",
            _cut(field),
        ) from None


def _too_deep(data: dict[str, Any]) -> str | None:
    """The first top-level field under which containers nest past MAX_JSON_DEPTH."""
    for key, value in data.items():
        stack: list[tuple[Any, int]] = [(value, 2)]  # the body's object is level 1
        while stack:
            node, depth = stack.pop()
            if not isinstance(node, dict | list):
                continue
            if depth > MAX_JSON_DEPTH:
                return str(key)
            children = node.values() if isinstance(node, dict) else node
            stack.extend((c, depth + 1) for c in children)
    return None


def _cut(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[:NAME_CHARS] + "..."


def _names(names: list[str]) -> str:
    """'a', 'b' and 3 more: at most LISTED_NAMES names, each at most NAME_CHARS long."""
    shown = ", ".join(repr(_cut(n)) for n in names[:LISTED_NAMES])
    more = len(names) - LISTED_NAMES
    return f"{shown} and {more:,} more" if more > 0 else shown


def _one(prompts: list[str]) -> str:
    if len(prompts) != 1:
        raise RequestError(
            400,
            "'prompt' must be one string: the router retrieves for a question, not batches",
            param="prompt",
        )
    return prompts[0]


def _invalid(exc: ValidationError) -> RequestError:
    """The first validation error as one line: "'messages.0': Input should be an object"."""
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
    message = str(err["msg"])
    if err["type"] == "model_type" or err["type"] == "dict_type":
        message = "Input should be an object"
    elif err["type"] == "literal_error" and where.endswith("role"):
        message = "Input should be one of system, developer, user, assistant, tool, function"
    where = _top_union_loc(where)
    return RequestError(400, f"'{where}': {message}", "invalid_value", where.split(".")[0])


def _top_union_loc(where: str) -> str:
    """Drop pydantic's union-branch labels ('content.str', 'prompt.list[str]')."""
    parts = [p for p in where.split(".") if p not in ("str", "list[str]", "list[ContentPart]")]
    return ".".join(parts)
