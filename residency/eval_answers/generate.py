"""The three ways an answer is generated, on the same questions and the same prompt text:

- `rag`: system = instructions + the top-k retrieved passages (`render_passage`), sent to the
  generator;
- `whole`: system = `render_prefix(DEFAULT_INSTRUCTIONS, every section in corpus order)` (CAG),
  sent to the generator, when it fits its max_model_len;
- `residency`: the bare question to the residency router, which adds the resident prefix and
  any long-tail passages itself and says so in `X-Residency-Route` / `X-Residency-Retrieved`.

All answers: temperature 0, a fixed max_tokens, streamed (TTFT apart from decode).
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from residency.corpus.model import Chunk, Section
from residency.errors import UpstreamError
from residency.eval_answers.chat import ChatError, StreamedAnswer, stream_chat
from residency.eval_answers.records import AnswerQuestion, StrategyName
from residency.eval_answers.scoring import evidence_visible
from residency.index import Index
from residency.planning.prefix import DEFAULT_INSTRUCTIONS, render_passage, render_prefix
from residency.vllm_client import VllmClient

ROUTE_HEADER = "x-residency-route"
RETRIEVED_HEADER = "x-residency-retrieved"
DOCS_HEADING = "# 参照文書 / Reference documents"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An OpenAI-compatible base URL and the model name to ask for."""

    base_url: str
    model: str


@dataclass(frozen=True, slots=True)
class Attempt:
    """One question put to one strategy: the answer (or why none) and what the prompt held."""

    answer: StreamedAnswer | None
    error: str | None
    route: str | None
    retrieved_ids: tuple[str, ...]  # section ids of the passages added, best first
    evidence_visible: bool | None
    retrieval_s: float | None


class AnswerStrategy(Protocol):
    """Generates one answer for a question."""

    name: StrategyName

    def answer(self, client: httpx.Client, question: AnswerQuestion) -> Attempt:
        """Generate (never raises for one question's failure: `Attempt.error`)."""
        ...


def answer_payload(model: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """Chat request body of every answer: greedy, fixed max_tokens."""
    return {"model": model, "messages": messages, "temperature": 0, "max_tokens": max_tokens}


def render_rag_system(instructions: str, passages: Sequence[str]) -> str:
    """Instructions then the retrieved passages, laid out like the resident prefix."""
    return "\n\n".join([instructions.strip(), DOCS_HEADING, *passages]) + "\n"


def unique(ids: Sequence[str]) -> tuple[str, ...]:
    """The ids in first-seen order without repeats."""
    return tuple(dict.fromkeys(ids))


def _stream(
    client: httpx.Client, base_url: str, payload: dict[str, Any]
) -> tuple[StreamedAnswer | None, str | None]:
    try:
        return stream_chat(client, base_url, payload), None
    except ChatError as exc:
        return None, str(exc)


class RagStrategy:
    """Top-k chunks from the index as passages in the system message."""

    name: StrategyName = "rag"

    def __init__(
        self,
        index: Index,
        generator: Endpoint,
        k: int,
        max_tokens: int,
        instructions: str = DEFAULT_INSTRUCTIONS,
    ) -> None:
        self._index = index
        self._chunks: Mapping[str, Chunk] = {c.id: c for c in index.chunks}
        self._generator = generator
        self._k = k
        self._max_tokens = max_tokens
        self._instructions = instructions

    def system_text(self, query: str) -> tuple[str, tuple[str, ...], float]:
        """(system message, retrieved section ids, retrieval seconds) for a query."""
        started = time.perf_counter()
        hits = self._index.search_chunks(query, self._k)
        elapsed = time.perf_counter() - started
        passages: list[str] = []
        for hit in hits:
            chunk = self._chunks[hit.id]
            passages.append(render_passage(self._index.section(chunk.section_id), chunk.text))
        retrieved = unique([self._index.section_of(h.id) for h in hits])
        return render_rag_system(self._instructions, passages), retrieved, elapsed

    def answer(self, client: httpx.Client, question: AnswerQuestion) -> Attempt:
        """Retrieve, then stream the answer from the generator."""
        system, retrieved, retrieval_s = self.system_text(question.query)
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": question.query},
        ]
        payload = answer_payload(self._generator.model, messages, self._max_tokens)
        answer, error = _stream(client, self._generator.base_url, payload)
        visible = evidence_visible(question.relevant_ids, retrieved)
        return Attempt(answer, error, self.name, retrieved, visible, retrieval_s)


def whole_text(sections: Sequence[Section], instructions: str = DEFAULT_INSTRUCTIONS) -> str:
    """The whole corpus as one system message, sections in corpus order."""
    return render_prefix(instructions, sorted(sections, key=lambda s: s.order))


def whole_skip_reason(client: VllmClient, model: str, system: str, max_tokens: int) -> str | None:
    """Why `whole` cannot run on this generator (too long for max_model_len), or None."""
    try:
        served = {m.id: m for m in client.models()}
        tokens = len(client.tokenize(system, model=model))
    except UpstreamError as exc:
        return f"cannot count the whole text's tokens on the generator ({exc})"
    max_model_len = served[model].max_model_len if model in served else None
    if max_model_len is None:
        return None  # the server does not say; an overflow becomes per-question errors
    if tokens + max_tokens <= max_model_len:
        return None
    room = max_model_len - tokens
    fix = (
        f"lower --max-tokens to at most {room} or serve a larger --max-model-len"
        if room > 0
        else f"serve the generator with --max-model-len of at least {tokens + max_tokens}"
    )
    return (
        f"the whole text is {tokens:,} tokens + --max-tokens {max_tokens} = "
        f"{tokens + max_tokens:,} > the generator's max_model_len {max_model_len:,}; {fix}"
    )


class WholeStrategy:
    """The whole corpus in the system message (cache-augmented generation)."""

    name: StrategyName = "whole"

    def __init__(
        self, system: str, section_ids: Collection[str], generator: Endpoint, max_tokens: int
    ):
        self._system = system
        self._section_ids = frozenset(section_ids)
        self._generator = generator
        self._max_tokens = max_tokens

    def answer(self, client: httpx.Client, question: AnswerQuestion) -> Attempt:
        """Stream the answer with every section in the prompt."""
        messages = [
            {"role": "system", "content": self._system},
            {"role": "user", "content": question.query},
        ]
        payload = answer_payload(self._generator.model, messages, self._max_tokens)
        answer, error = _stream(client, self._generator.base_url, payload)
        visible = evidence_visible(question.relevant_ids, self._section_ids)
        return Attempt(answer, error, self.name, (), visible, None)


def parse_retrieved_header(value: str | None) -> tuple[str, ...]:
    """Section ids of `X-Residency-Retrieved`: comma-separated, each percent-encoded."""
    if not value:
        return ()
    return tuple(urllib.parse.unquote(part) for part in value.split(",") if part.strip())


class ResidencyStrategy:
    """The bare question through the residency router (resident prefix + long-tail retrieval)."""

    name: StrategyName = "residency"

    def __init__(
        self, router: Endpoint, resident_ids: Collection[str] | None, max_tokens: int
    ) -> None:
        self._router = router
        self._resident = frozenset(resident_ids) if resident_ids is not None else None
        self._max_tokens = max_tokens

    def visible(self, relevant_ids: Sequence[str], retrieved: Sequence[str]) -> bool | None:
        """Gold resident or retrieved; without a plan only a retrieved gold can be told."""
        if self._resident is not None:
            return evidence_visible(relevant_ids, self._resident | set(retrieved))
        return True if evidence_visible(relevant_ids, retrieved) else None

    def answer(self, client: httpx.Client, question: AnswerQuestion) -> Attempt:
        """Stream the router's answer; read its route and retrieved ids from the headers."""
        messages = [{"role": "user", "content": question.query}]
        payload = answer_payload(self._router.model, messages, self._max_tokens)
        answer, error = _stream(client, self._router.base_url, payload)
        if answer is None:
            return Attempt(None, error, None, (), None, None)
        route = answer.headers.get(ROUTE_HEADER) or None
        retrieved = parse_retrieved_header(answer.headers.get(RETRIEVED_HEADER))
        visible = self.visible(question.relevant_ids, retrieved)
        return Attempt(answer, None, route, retrieved, visible, None)
