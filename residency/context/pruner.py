"""The listwise pruner (docs/design/routing.md): a small model grades every retrieved passage
at once.

The question and all n passages go to an OpenAI-compatible chat endpoint in one request; the
passages are labelled 1..n (short numbers a small model copes with, not chunk ids). The reply is
constrained by `response_format` json_schema (strict) to exactly

    {"grades":[{"passage":1,"grade":5},{"passage":2,"grade":1},...]}

with `prefixItems` pinning item i to passage i, grades an enum 1..5 and no other keys, so a
constrained decoder cannot skip, repeat or reorder passages. We keep passages graded at or above
`threshold`, plus the first `keep_top_k` in retrieval order whatever their grade. Any failure
(timeout, HTTP error, reply that is not schema-valid JSON or was cut at max_tokens) keeps every
passage, logs a warning on `residency.pruner`, and returns `valid=False` with `error` set: the
pruner can only ever make a prompt shorter, never fail a request.

Server flag. vLLM's default JSON grammar (xgrammar, `any_whitespace`) lets a model emit
whitespace between tokens without bound; a small or random-weight model then loops on "\\r" or
" " until max_tokens (measured on the tiny test model: 400 of 400 tokens, no "grades" array).
Whitespace is a server-wide setting (the per-request `disable_any_whitespace` is ignored by the
xgrammar and guidance backends in vLLM 0.32), so start the pruner's vLLM with

    --structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}'

(`PRUNER_SERVER_ARGS`; xgrammar runs on the CPU build). The reply is then compact JSON:
~24 tokens per passage with the tiny tokenizer, 5 passages in ~0.3 s on 2 cores.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import httpx
import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from residency.context.pruner_settings import PRUNER_FLAG, PRUNER_SERVER_FLAG, PrunerSettings
from residency.errors import UpstreamError
from residency.prompt_language import LanguageCode
from residency.vllm_client import AsyncVllmClient, RawAnswer, Session, VllmClient, endpoints
from residency.vllm_client.wire import status_error

LOGGER = logging.getLogger("residency.pruner")
GRADES: tuple[int, ...] = (1, 2, 3, 4, 5)
SCHEMA_NAME = "passage_grades"
# Reply budget per request: a compact item `{"passage":12,"grade":5},` is 26 ASCII characters, so
# even one token per character fits in 48 per passage (room for a pretty-printed reply too),
# while a whitespace loop is cut after 16 + 48 n tokens instead of running to max_tokens.
REPLY_TOKENS_BASE = 16
REPLY_TOKENS_PER_PASSAGE = 48
LOGGED_REPLY_CHARS = 200

Failure = Literal["invalid_output", "upstream"]

# Japanese corpora keep the bilingual prompt; English ones get English only (prompt_language.py).
SYSTEM_PROMPT = """\
あなたは検索結果の選別係です。質問に答えるために各文書がどれだけ必要かを 1〜5 で採点してください。
You grade how much each numbered passage is needed to answer the question.

5 必須 essential: 答えそのものが書かれている / the answer is stated in it
4 貢献 contributing: 答えに直接役立つ情報がある / it directly helps to answer
3 補助 supporting: 背景や補足になる / useful background or context
2 周辺 tangential: 話題は近いが答えには不要 / same topic, not needed for the answer
1 無関係 unrelated: 関係がない / nothing to do with the question

すべての文書を番号順に一度ずつ採点し、JSON だけを返してください。
Grade every passage once, in order, and reply with JSON only:
{"grades":[{"passage":1,"grade":5},{"passage":2,"grade":1}]}"""
SYSTEM_PROMPT_EN = """\
You grade how much each numbered passage is needed to answer the question.
5 essential: the answer is stated in it
4 contributing: it directly helps to answer
3 supporting: useful background or context
2 tangential: same topic, not needed for the answer
1 unrelated: nothing to do with the question
Grade every passage once, in order, and reply with JSON only:
{"grades":[{"passage":1,"grade":5},{"passage":2,"grade":1}]}"""


@dataclass(frozen=True, slots=True)
class Passage:
    """One retrieved chunk offered to the pruner: its id (kept ids refer to it) and its text."""

    id: str
    text: str


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What the pruner kept (ids in input order), the grades by id, and whether they are real.

    On a failure `valid` is False, `grades` empty, every id kept, and `failure` says whether the
    endpoint failed ("upstream": unreachable, timeout, non-200) or its reply was unusable
    ("invalid_output"); `error` is the one-line reason either way.
    """

    kept_ids: tuple[str, ...]
    grades: dict[str, int] = field(default_factory=dict)
    valid: bool = True
    error: str | None = None
    elapsed_s: float = 0.0
    failure: Failure | None = None


class _Grade(BaseModel):
    """One item of the reply."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    passage: StrictInt = Field(ge=1, description="1-based passage label.")
    grade: StrictInt = Field(ge=1, le=5, description="5 essential ... 1 unrelated.")


class _Reply(BaseModel):
    """The whole reply the schema allows."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    grades: tuple[_Grade, ...] = Field(max_length=10_000, description="One grade per passage.")


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    content: str | None = Field(default=None, description="The assistant's text.")


class _Choice(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    message: _Message = Field(description="The reply message.")
    finish_reason: str | None = Field(default=None, description="stop, length, ...")


class _ChatResponse(BaseModel):
    """The part of an OpenAI chat-completions response the pruner reads."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    choices: tuple[_Choice, ...] = Field(min_length=1, description="Completions; we read one.")


class InvalidReplyError(ValueError):
    """The model's reply is not one schema-valid grade per passage (internal: means keep all)."""


def keep_ids(
    grades: Mapping[str, int], order: Sequence[str], threshold: int, keep_top_k: int
) -> tuple[str, ...]:
    """Ids of `order` graded >= threshold, plus its first keep_top_k whatever their grade."""
    floor = set(order[: max(keep_top_k, 0)])
    return tuple(i for i in order if i in floor or grades.get(i, 0) >= threshold)


def grade_schema(n: int) -> dict[str, Any]:
    """The JSON schema of a reply grading passages 1..n: item i is passage i, grade in 1..5."""
    items = [
        {
            "type": "object",
            "properties": {
                "passage": {"type": "integer", "enum": [i]},
                "grade": {"type": "integer", "enum": list(GRADES)},
            },
            "required": ["passage", "grade"],
            "additionalProperties": False,
        }
        for i in range(1, n + 1)
    ]
    grades = {"type": "array", "prefixItems": items, "items": False, "minItems": n, "maxItems": n}
    return {
        "type": "object",
        "properties": {"grades": grades},
        "required": ["grades"],
        "additionalProperties": False,
    }


def build_prompt(question: str, passages: Sequence[Passage], language: LanguageCode = "ja") -> str:
    """The user message: the question, then every passage under its number."""
    ja = language == "ja"
    parts = [f"{'質問 / ' if ja else ''}Question: {question.strip()}", ""]
    for i, passage in enumerate(passages, start=1):
        parts.append(f"[{i}] {passage.text.strip()}")
    n = len(passages)
    ask = f"文書 1〜{n} を採点してください。 / Grade passages 1-{n}." if ja else f"Grade 1-{n}."
    parts += ["", ask]
    return "\n".join(parts)


def build_request(
    settings: PrunerSettings, question: str, passages: Sequence[Passage]
) -> dict[str, Any]:
    """The chat-completions body: greedy, schema-constrained, reply tokens bounded by n."""
    n = len(passages)
    ja = settings.language == "ja"
    return {
        "model": settings.model,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT if ja else SYSTEM_PROMPT_EN},
            {"role": "user", "content": build_prompt(question, passages, settings.language)},
        ],
        "temperature": 0,
        "max_tokens": min(settings.max_tokens, REPLY_TOKENS_BASE + REPLY_TOKENS_PER_PASSAGE * n),
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": SCHEMA_NAME, "schema": grade_schema(n), "strict": True},
        },
    }


def _clip(text: str) -> str:
    return text if len(text) <= LOGGED_REPLY_CHARS else text[:LOGGED_REPLY_CHARS] + "..."


def parse_grades(content: str, n: int) -> list[int]:
    """Grades of passages 1..n from the reply text; `InvalidReplyError` unless each graded once."""
    try:
        reply = _Reply.model_validate(orjson.loads(content))
    except orjson.JSONDecodeError as exc:
        raise InvalidReplyError(f"reply is not JSON ({exc}): {_clip(content)!r}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "reply"
        raise InvalidReplyError(f"reply does not match the schema ({loc}: {err['msg']})") from None
    by_label: dict[int, int] = {}
    for item in reply.grades:
        if item.passage > n:
            raise InvalidReplyError(f"reply grades passage {item.passage}, only 1..{n} exist")
        if item.passage in by_label:
            raise InvalidReplyError(f"reply grades passage {item.passage} twice")
        by_label[item.passage] = item.grade
    missing = [i for i in range(1, n + 1) if i not in by_label]
    if missing:
        raise InvalidReplyError(f"reply leaves passage(s) {missing[:10]} of 1..{n} ungraded")
    return [by_label[i] for i in range(1, n + 1)]


def parse_response(body: bytes, n: int) -> list[int]:
    """Grades from a chat-completions response body; `InvalidReplyError` for anything else."""
    try:
        choice = _ChatResponse.model_validate(orjson.loads(body)).choices[0]
    except (orjson.JSONDecodeError, ValidationError):
        raise InvalidReplyError("response is not an OpenAI chat completion") from None
    content = choice.message.content or ""
    if choice.finish_reason == "length":
        raise InvalidReplyError(
            f"reply cut at max_tokens after {len(content)} characters (a whitespace loop? start "
            f"vLLM with {PRUNER_SERVER_FLAG}): {_clip(content)!r}"
        )
    return parse_grades(content, n)


def _check_ids(passages: Sequence[Passage]) -> None:
    if len({p.id for p in passages}) != len(passages):
        raise ValueError("passage ids must be unique: kept ids refer to them")


def _kept(settings: PrunerSettings, passages: Sequence[Passage], grades: list[int]) -> PruneResult:
    order = [p.id for p in passages]
    by_id = dict(zip(order, grades, strict=True))
    return PruneResult(keep_ids(by_id, order, settings.threshold, settings.keep_top_k), by_id)


def _kept_all(passages: Sequence[Passage], failure: Failure, error: str) -> PruneResult:
    """Everything kept, and the reason logged."""
    LOGGER.warning("pruner kept all %d passages (%s): %s", len(passages), failure, error)
    return PruneResult(tuple(p.id for p in passages), {}, False, error, failure=failure)


def _from_answer(
    settings: PrunerSettings, passages: Sequence[Passage], answer: RawAnswer
) -> PruneResult:
    """The result of one HTTP reply of the chat endpoint."""
    if answer.status_code != 200:
        where = f"{PRUNER_FLAG} {endpoints.base_url(settings.url)}"
        error = status_error(where, endpoints.CHAT, answer.status_code, answer.content)
        return _kept_all(passages, "upstream", _clip(str(error)))
    try:
        return _kept(settings, passages, parse_response(answer.content, len(passages)))
    except InvalidReplyError as exc:
        return _kept_all(passages, "invalid_output", str(exc))


def _timed(result: PruneResult, started: float) -> PruneResult:
    return replace(result, elapsed_s=time.perf_counter() - started)


async def prune(
    client: Session,
    settings: PrunerSettings,
    question: str,
    passages: Sequence[Passage],
) -> PruneResult:
    """Grade `passages` for `question` and keep the useful ones; never raises on upstream faults."""
    _check_ids(passages)
    started = time.perf_counter()
    if not passages:
        return PruneResult(())
    upstream = AsyncVllmClient(settings.url, client, api_key=settings.api_key, flag=PRUNER_FLAG)
    try:
        answer = await upstream.chat_response(
            build_request(settings, question, passages), timeout_s=settings.timeout_s
        )
    except UpstreamError as exc:
        return _timed(_kept_all(passages, "upstream", _clip(str(exc))), started)
    return _timed(_from_answer(settings, passages, answer), started)


def prune_sync(
    settings: PrunerSettings,
    question: str,
    passages: Sequence[Passage],
    *,
    client: httpx.Client | None = None,
) -> PruneResult:
    """`prune` for synchronous callers (eval, CLI); pass `client` to reuse its connections."""
    _check_ids(passages)
    started = time.perf_counter()
    if not passages:
        return PruneResult(())
    with VllmClient(
        settings.url,
        timeout_s=settings.timeout_s,
        api_key=settings.api_key,
        flag=PRUNER_FLAG,
        http=client,
    ) as upstream:
        try:
            answer = upstream.chat_response(build_request(settings, question, passages))
        except UpstreamError as exc:
            return _timed(_kept_all(passages, "upstream", _clip(str(exc))), started)
    return _timed(_from_answer(settings, passages, answer), started)
