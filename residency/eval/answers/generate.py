"""The ways an answer is generated, on the same questions, in the router's prompt shape
(`context.prompt.assemble_messages`) and the corpus's language (`index.language`), so that what
differs between strategies is the evidence in the prompt, not its wording:

- `echo`: no model at all — the question itself is the answer: the scorer's floor (a weak model
  that only restates the question earns about this much token F1);
- `rag` (one per `k`, labelled `rag-topK`): system = the instructions alone; the top-k fused
  passages (`render_passage`) go into the user turn before the question, as the router puts
  its long-tail passages — a router with nothing resident;
- `whole`: system = `render_prefix(instructions, every section in corpus order)` (CAG), then
  the bare question, when it fits the generator's max_model_len;
- `residency`: the bare question to the residency router, which adds the resident prefix and
  any long-tail passages itself and says so in `X-Residency-Route` / `X-Residency-Retrieved`.

All answers: temperature 0, a fixed max_tokens, streamed (TTFT apart from decode).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from residency.context.headers import parse_retrieved_header, read_route_headers
from residency.context.prompt import ContextBlock, assemble_messages
from residency.corpus.model import Section
from residency.errors import UpstreamError
from residency.eval.answers.options import StrategyName
from residency.eval.answers.records import AnswerQuestion
from residency.eval.answers.scoring import evidence_visible
from residency.index import Index
from residency.planning.prefix import render_passage, render_prefix
from residency.prompt_language import PromptLanguage
from residency.vllm_client import StreamedAnswer, VllmClient

__all__ = ["parse_retrieved_header"]  # read here for the router's answers; tests use it too


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An OpenAI-compatible server's client and the model name to ask for."""

    client: VllmClient
    model: str

    @property
    def base_url(self) -> str:
        """The server's base URL."""
        return self.client.base_url


@dataclass(frozen=True, slots=True)
class Attempt:
    """One question put to one strategy: the answer (or why none) and what the prompt held."""

    answer: StreamedAnswer | None
    error: str | None
    route: str | None
    retrieved_ids: tuple[str, ...]  # section ids of the passages added, best first
    evidence_visible: bool | None
    retrieval_s: float | None
    citations: tuple[str, ...] = ()  # where each added passage is from, 'manual.pdf p. 4'


class AnswerStrategy(Protocol):
    """Generates one answer for a question."""

    name: str  # the label: rag-topK, whole, residency
    kind: StrategyName
    k: int | None

    def answer(self, question: AnswerQuestion) -> Attempt:
        """Generate (never raises for one question's failure: `Attempt.error`)."""
        ...


def answer_payload(model: str, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """Chat request body of every answer: greedy, fixed max_tokens."""
    return {"model": model, "messages": messages, "temperature": 0, "max_tokens": max_tokens}


def rag_messages(
    language: PromptLanguage, passages: Sequence[str], question: str
) -> list[dict[str, Any]]:
    """The router's shape with nothing resident: instructions, then passages + question."""
    block = ContextBlock(period_line=None, passages=tuple(passages), language=language)
    return assemble_messages([{"role": "user", "content": question}], language.instructions, block)


def unique(ids: Sequence[str]) -> tuple[str, ...]:
    """The ids in first-seen order without repeats."""
    return tuple(dict.fromkeys(ids))


def _stream(
    endpoint: Endpoint, messages: list[dict[str, Any]], max_tokens: int
) -> tuple[StreamedAnswer | None, str | None]:
    """The streamed answer, or why there is none."""
    try:
        payload = answer_payload(endpoint.model, messages, max_tokens)
        return endpoint.client.stream_chat(payload), None
    except UpstreamError as exc:
        return None, str(exc)


class RagStrategy:
    """Top-k fused chunks from the index as passages before the question."""

    kind: StrategyName = "rag"

    def __init__(self, index: Index, generator: Endpoint, k: int, max_tokens: int) -> None:
        self._index = index
        self._generator = generator
        self.k: int | None = k
        self.name = f"rag-top{k}"
        self._max_tokens = max_tokens

    def messages(
        self, query: str
    ) -> tuple[list[dict[str, Any]], tuple[str, ...], float, tuple[str, ...]]:
        """(chat messages, retrieved section ids, retrieval seconds, where each passage is from
        ('manual.pdf p. 4', once each)) for a query."""
        assert self.k is not None
        started = time.perf_counter()
        hits = self._index.search_chunks(query, self.k)
        elapsed = time.perf_counter() - started
        passages: list[str] = []
        cites: list[str] = []
        for hit in hits:
            chunk = self._index.chunk(hit.id)
            section = self._index.section(chunk.section_id)
            passages.append(render_passage(section, chunk.text, chunk.start_char))
            cites.append(section.cite(chunk.start_char, chunk.end_char))
        retrieved = unique([self._index.section_of(h.id) for h in hits])
        messages = rag_messages(self._index.language, passages, query)
        return messages, retrieved, elapsed, unique(cites)

    def answer(self, question: AnswerQuestion) -> Attempt:
        """Retrieve, then stream the answer from the generator."""
        messages, retrieved, retrieval_s, cites = self.messages(question.query)
        answer, error = _stream(self._generator, messages, self._max_tokens)
        visible = evidence_visible(question.relevant_ids, retrieved)
        return Attempt(answer, error, self.kind, retrieved, visible, retrieval_s, cites)


def whole_text(sections: Sequence[Section], language: PromptLanguage) -> str:
    """The whole corpus as one system message, sections in corpus order."""
    ordered = sorted(sections, key=lambda s: s.order)
    return render_prefix(language.instructions, ordered, language)


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

    name = "whole"
    kind: StrategyName = "whole"
    k: int | None = None

    def __init__(
        self, system: str, section_ids: Collection[str], generator: Endpoint, max_tokens: int
    ):
        self._system = system
        self._section_ids = frozenset(section_ids)
        self._generator = generator
        self._max_tokens = max_tokens

    def answer(self, question: AnswerQuestion) -> Attempt:
        """Stream the answer with every section in the prompt."""
        messages = [
            {"role": "system", "content": self._system},
            {"role": "user", "content": question.query},
        ]
        answer, error = _stream(self._generator, messages, self._max_tokens)
        visible = evidence_visible(question.relevant_ids, self._section_ids)
        return Attempt(answer, error, self.kind, (), visible, None)


class EchoStrategy:
    """The question as its own answer: what restating it scores, with no model and no text."""

    name = "echo"
    kind: StrategyName = "echo"
    k: int | None = None

    def answer(self, question: AnswerQuestion) -> Attempt:
        """No request: the answer is the question."""
        echoed = StreamedAnswer(question.query, "echo", None, None, None, None, None, {})
        return Attempt(echoed, None, self.kind, (), None, None)


class ResidencyStrategy:
    """The bare question through the residency router (resident prefix + long-tail retrieval)."""

    name = "residency"
    kind: StrategyName = "residency"
    k: int | None = None

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

    def answer(self, question: AnswerQuestion) -> Attempt:
        """Stream the router's answer; read its route and retrieved ids from the headers."""
        messages = [{"role": "user", "content": question.query}]
        answer, error = _stream(self._router, messages, self._max_tokens)
        if answer is None:
            return Attempt(None, error, None, (), None, None)
        route, retrieved = read_route_headers(answer.headers)
        visible = self.visible(question.relevant_ids, retrieved)
        return Attempt(answer, None, route, retrieved, visible, None)
