"""A repeated question recomputes nothing on the router's path: the ContextBuilder keeps each
question's ranking, period and route (per day its time expression resolves against), so asking
again searches no retriever — no vector, no BM25 scores, no fusion, no routing (a real BM25
index, a real several-prefix plan, the real ContextBuilder; the retriever is wrapped only to
count its searches)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from section_index import section_index
from test_top_sections import QUERIES, SECTIONS, several_prefix_plan

import residency.context.builder as context
from residency.context.builder import ContextBuilder
from residency.context.routing import ChunkHit
from residency.context.settings import ContextSettings
from residency.index import Index
from residency.planning.plan_model import write_plan
from residency.tokenizer import LocalTokenizer


class CountingSearch:
    """The builder's own retriever, with every search counted."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.queries: list[str] = []

    def search(self, query: str, k: int) -> Sequence[ChunkHit]:
        self.queries.append(query)
        hits: Sequence[ChunkHit] = self.inner.search(query, k)
        return hits


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Index:
    return section_index(tmp_path_factory.mktemp("question-cache"), SECTIONS, tokenizer_dir)


def builder_of(index: Index, tokenizer_dir: Path, tmp_path: Path) -> ContextBuilder:
    plan = several_prefix_plan(index, LocalTokenizer(tokenizer_dir))
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    return ContextBuilder(plan, index, ContextSettings(retriever="bm25"))


@pytest.fixture
def builder(index: Index, tokenizer_dir: Path, tmp_path: Path) -> ContextBuilder:
    return builder_of(index, tokenizer_dir, tmp_path)


def counted(builder: ContextBuilder) -> CountingSearch:
    counter = CountingSearch(builder.retriever)
    builder.retriever = counter
    return counter


def test_a_repeated_question_is_not_searched_again(builder: ContextBuilder) -> None:
    counter = counted(builder)
    first = [builder.retrieve(q) for q in QUERIES]
    searched = len(counter.queries)
    assert searched >= len(QUERIES)  # every new question searched (and its second hop, if any)
    again = [builder.retrieve(q) for q in QUERIES]
    assert len(counter.queries) == searched  # nothing searched the second time
    for a, b in zip(first, again, strict=True):
        assert (a.route, a.prefix_id, a.chunk_ids, a.top_chunk_id, a.dated_section_ids) == (
            b.route,
            b.prefix_id,
            b.chunk_ids,
            b.top_chunk_id,
            b.dated_section_ids,
        )


def test_recall_is_none_until_asked(builder: ContextBuilder) -> None:
    counter = counted(builder)
    question = QUERIES[1]
    assert builder.recall(question) is None
    assert counter.queries == []  # recall never searches
    asked = builder.retrieve(question)
    kept = builder.recall(question)
    assert kept is not None
    assert (kept.route, kept.chunk_ids, kept.prefix_id) == (
        asked.route,
        asked.chunk_ids,
        asked.prefix_id,
    )
    assert builder.recall(question + "?") is None  # another text is another question


def test_the_day_is_part_of_the_key(builder: ContextBuilder) -> None:
    counter = counted(builder)
    question = "What was done last month?"
    june = builder.retrieve(question, dt.date(2025, 6, 15))
    july = builder.retrieve(question, dt.date(2025, 7, 15))
    assert june.period != july.period  # "last month" moved with the day
    assert len(counter.queries) == 2
    assert builder.recall(question, dt.date(2025, 6, 15)) is not None
    assert builder.recall(question, dt.date(2025, 8, 15)) is None


def test_the_oldest_question_goes_past_the_bound(
    builder: ContextBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(context, "RECENT_QUESTIONS", 2)
    a, b, c = QUERIES[:3]
    builder.retrieve(a)
    builder.retrieve(b)
    builder.retrieve(a)  # a is now the most recent
    builder.retrieve(c)  # b goes
    assert builder.recall(b) is None
    assert builder.recall(a) is not None
    assert builder.recall(c) is not None


def test_a_repeated_question_s_context_is_rendered_once(builder: ContextBuilder) -> None:
    question = QUERIES[0]
    first = builder.retrieve(question)
    block = builder.render(first, first.chunk_ids)
    assert block.passages  # something was added after the prefix
    again = builder.recall(question)
    assert again is not None
    assert builder.render(again, again.chunk_ids) is block  # the same object: nothing rendered
    fewer = builder.render(again, again.chunk_ids[:-1])
    assert fewer.passages == block.passages[: len(fewer.passages)]  # other chunks: rendered
