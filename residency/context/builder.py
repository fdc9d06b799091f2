"""Per-request context: retrieve over the whole corpus, route it (`routing.route_question`: the
prefix, the long-tail chunks, the dated sections pinned for a time expression, the top sections
wherever they live, the second hop), optionally prune, and render what goes after the resident
prefix.

Shared by the router and `residency eval answers`, so both put the same text in front of the
model for the same question.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from residency.context.prompt import ContextBlock
from residency.context.pruner import Passage, PruneResult, prune
from residency.context.retriever import chunk_retriever
from residency.context.routing import ChunkHit, PrefixRoutes, RoutedQuestion, route_question
from residency.context.settings import ContextSettings
from residency.corpus.model import Section
from residency.errors import ConfigError
from residency.index import Index
from residency.planning.plan_model import ResidencyPlan
from residency.planning.prefix import render_passage
from residency.timex import Period, resolve_period, select_dated
from residency.vllm_client import Session

RequestRoute = Literal["resident", "long_tail", "dated"]
# Second-hop rankings kept per loaded index (one per pivot chunk; a few MB at most).
PIVOT_CACHE = 4096
# Questions whose ranking, period and route are kept per plan (a repeated question recomputes
# nothing: no vector, no BM25 scores, no fusion, no routing; ~2 KB each).
RECENT_QUESTIONS = 4096


@dataclass(frozen=True, slots=True)
class Retrieval:
    """What retrieval and routing chose for one question (before pruning)."""

    question: str
    route: RequestRoute
    top_chunk_id: str | None
    chunk_ids: tuple[str, ...]  # chunks added after the prefix (route_question's order)
    period: Period | None
    dated_section_ids: tuple[str, ...]  # sections pinned for the period, first in the prompt
    retrieval_s: float
    prefix_id: str = "p0"  # the resident prefix the request goes out with


@dataclass(frozen=True, slots=True)
class RequestContext:
    """The final context of one request."""

    retrieval: Retrieval
    kept_chunk_ids: tuple[str, ...]
    section_ids: tuple[str, ...]  # sections whose text follows the prefix, prompt order, once
    prune: PruneResult | None
    block: ContextBlock


@dataclass(frozen=True, slots=True)
class _Routed:
    """One question's period and route, kept for when it is asked again."""

    period: Period | None
    routed: RoutedQuestion

    def retrieval(self, question: str, seconds: float) -> Retrieval:
        r = self.routed
        return Retrieval(
            question=question,
            route="dated" if r.dated_section_ids else r.route,
            top_chunk_id=r.top_chunk_id,
            chunk_ids=r.chunk_ids,
            period=self.period,
            dated_section_ids=r.dated_section_ids,
            retrieval_s=seconds,
            prefix_id=r.prefix_id,
        )


class ContextBuilder:
    """Builds request contexts from a plan and the index it was made from."""

    def __init__(self, plan: ResidencyPlan, index: Index, settings: ContextSettings) -> None:
        if plan.corpus_hash != index.manifest.corpus_hash:
            raise ConfigError(
                f"--plan was made from corpus {plan.corpus_hash[:12]} but --index "
                f"{index.directory} holds corpus {index.manifest.corpus_hash[:12]}: re-run "
                "`residency plan` on this index (or pass the index the plan names)"
            )
        self.plan = plan
        self.index = index
        self.settings = settings
        self.resident_chunk_ids = plan.resident_chunk_ids()
        self.prefixes = {p.id: p for p in plan.all_prefixes()}
        self.default_prefix = plan.all_prefixes()[0].id
        self._routes = PrefixRoutes.build(
            (
                (p.id, frozenset(c for item in p.resident for c in item.chunk_ids))
                for p in self.prefixes.values()
            ),
            index.section_of,
        )
        # The second hop's query is a chunk's own text: its ranking never changes while this
        # index is loaded (lru_cache is safe from the threads retrieve runs on).
        self._pivot_hits = lru_cache(maxsize=PIVOT_CACHE)(self._rank_chunk_text)
        # question and the day its time expression resolves against -> (period, route); the
        # plan, index and settings never change under one builder (a reload builds a new one)
        self._recent: OrderedDict[tuple[str, dt.date], _Routed] = OrderedDict()
        self._recent_lock = threading.Lock()
        self._rendered = lru_cache(maxsize=RECENT_QUESTIONS)(self._render)
        self.retriever = chunk_retriever(index, settings.retriever)
        self._pruner = (
            settings.pruner.model_copy(update={"language": index.language.code})
            if settings.pruner is not None
            else None
        )

    def warm_up(self) -> None:
        """Load the retrievers (and the embedder) now rather than on the first request."""
        self.retriever.search("warm up", 1)

    def retrieve(self, question: str, today: dt.date | None = None) -> Retrieval:
        """Retrieve, route and pin dated sections (CPU-bound: run it off the event loop); a
        question asked before (for the same day) is a lookup."""
        started = time.perf_counter()
        key = (question, self._today(today))
        routed = self._lookup(key)
        if routed is None:
            routed = self._route(*key)
            with self._recent_lock:
                self._recent[key] = routed
                while len(self._recent) > RECENT_QUESTIONS:
                    self._recent.popitem(last=False)
        return routed.retrieval(question, time.perf_counter() - started)

    def recall(self, question: str, today: dt.date | None = None) -> Retrieval | None:
        """The retrieval of a question asked before (for the same day), or None: a dictionary
        lookup, cheap enough for the event loop."""
        started = time.perf_counter()
        routed = self._lookup((question, self._today(today)))
        return None if routed is None else routed.retrieval(question, time.perf_counter() - started)

    def _today(self, today: dt.date | None) -> dt.date:
        return today or self.settings.routing.today or dt.date.today()

    def _lookup(self, key: tuple[str, dt.date]) -> _Routed | None:
        with self._recent_lock:
            routed = self._recent.get(key)
            if routed is not None:
                self._recent.move_to_end(key)
            return routed

    def _route(self, question: str, today: dt.date) -> _Routed:
        """Rank the whole corpus for `question`, resolve its period and route it."""
        s = self.settings.routing
        hits: Sequence[ChunkHit] = self.retriever.search(
            question, max(s.prefetch, s.k + 1, s.spread)
        )
        period = resolve_period(question, today)

        def pin(prefix_chunks: frozenset[str]) -> tuple[str, ...]:
            return pinned_dated(self.index, period, hits, prefix_chunks, s.max_dated)

        routed = route_question(
            hits, self._routes, s, self.index.section_of, pin_dated=pin, pivot_hits=self._pivot_hits
        )
        return _Routed(period, routed)

    def _rank_chunk_text(self, chunk_id: str) -> tuple[ChunkHit, ...]:
        """The ranking of one chunk's own text (the second hop's query)."""
        text = self.index.chunk(chunk_id).text
        return tuple(self.retriever.search(text, self.settings.routing.prefetch))

    def prefix_text(self, prefix_id: str) -> str:
        """The exact system-message text of one resident prefix."""
        return self.prefixes[prefix_id].prefix.text

    async def finish(self, retrieval: Retrieval, http: Session) -> RequestContext:
        """Prune the long-tail chunks (when a pruner is set) and render the context block."""
        kept = retrieval.chunk_ids
        result: PruneResult | None = None
        if self._pruner is not None and len(kept) > self._pruner.keep_top_k:
            passages = [Passage(id=c, text=self.index.chunk(c).text) for c in kept]
            result = await prune(http, self._pruner, retrieval.question, passages)
            kept = result.kept_ids
        sections = (*retrieval.dated_section_ids, *(self.index.section_of(c) for c in kept))
        return RequestContext(
            retrieval, kept, tuple(dict.fromkeys(sections)), result, self.render(retrieval, kept)
        )

    def render(self, retrieval: Retrieval, chunk_ids: Sequence[str]) -> ContextBlock:
        """The rendered period line and passages (dated sections whole, then chunks); the same
        ones again (a repeated question) are a lookup."""
        return self._rendered(retrieval.dated_section_ids, tuple(chunk_ids), retrieval.period)

    def _render(
        self, section_ids: tuple[str, ...], chunk_ids: tuple[str, ...], period: Period | None
    ) -> ContextBlock:
        passages = [self._render_section(sid) for sid in section_ids]
        passages += [self._render_chunk(cid) for cid in chunk_ids]
        language = self.index.language
        line = period.describe(language) if period is not None else None
        return ContextBlock(period_line=line, passages=tuple(passages), language=language)

    def _render_section(self, section_id: str) -> str:
        section: Section = self.index.section(section_id)
        return render_passage(section, section.text)

    def _render_chunk(self, chunk_id: str) -> str:
        chunk = self.index.chunk(chunk_id)
        return render_passage(self.index.section(chunk.section_id), chunk.text, chunk.start_char)


def pinned_dated(
    index: Index,
    period: Period | None,
    hits: Sequence[ChunkHit],
    prefix_chunks: Collection[str],
    max_dated: int,
) -> tuple[str, ...]:
    """The dated route: ids of the sections pinned whole for a question's `period`, those dated
    inside it (`select_dated`: retrieved ones first, at most `max_dated`), less any wholly in
    the routed prefix (`prefix_chunks`), which the prompt already holds. The router and the
    coverage evaluation both call it, so they pin the same sections."""
    if period is None or max_dated <= 0:
        return ()
    ranked = list(dict.fromkeys(index.section_of(h.id) for h in hits))
    return tuple(
        s.id
        for s in select_dated(index.sections, period, ranked, max_dated)
        if not ((chunks := index.chunks_of(s.id)) and all(c.id in prefix_chunks for c in chunks))
    )
