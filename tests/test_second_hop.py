"""The second retrieval hop (`--hops 2`) on a hand-made corpus: a question that needs two
sections retrieves the first, whose text names the second; the router and the coverage
evaluation add the same chunk for it (real files, a real BM25 index, the real ContextBuilder)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from section_index import section_index

from residency.context.builder import ContextBuilder
from residency.context.routing import PrefixRoutes, RoutingSettings, route_question, second_hop
from residency.context.settings import ContextSettings
from residency.eval.coverage import ResidentSet, evaluate_coverage, rank_queries
from residency.eval.hops import PivotRankings
from residency.eval.questions import Question
from residency.index import Index
from residency.planning.build import PlanOptions, build_plan, log_mass
from residency.planning.plan_model import CapacitySnapshot, write_plan
from residency.query_log import LogEntry
from residency.tokenizer import LocalTokenizer

SECTIONS = {
    "kanzaki": (
        "Kanzaki Lighthouse",
        "Kanzaki Lighthouse stands on the northern cape. Its fog device is an Orca horn; the "
        "Orca horn was fitted in 2019.",
    ),
    "orca": ("Orca horn", "The Orca horn blasts twice each minute, audible at four miles."),
    "unoshima": ("Unoshima Lighthouse", "Unoshima Lighthouse flashes white every five seconds."),
    "radio": ("Radio", "The radio room answers on channel 16 around the clock."),
    "paint": ("Painting", "Towers are painted white and red every ten years."),
}
# Needs two sections: the question's words reach kanzaki; only kanzaki's text reaches orca.
RELATION = Question(
    query="How often does the fog device at Kanzaki Lighthouse sound?",
    relevant_ids=("kanzaki", "orca"),
    type="relation",
)
SIMPLE = Question(
    query="Which channel does the radio room answer on?", relevant_ids=("radio",), type="simple"
)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Index:
    return section_index(tmp_path_factory.mktemp("hops"), SECTIONS, tokenizer_dir)


@dataclass(frozen=True)
class Hit:
    id: str


def test_second_hop_takes_the_best_chunk_of_an_unseen_section() -> None:
    hits = [Hit("a::c1"), Hit("a::c2"), Hit("b::c1"), Hit("c::c1")]
    section_of = lambda c: c.split("::")[0]  # noqa: E731
    assert second_hop(hits, {"a"}, section_of) == "b::c1"
    assert second_hop(hits, {"a", "b"}, section_of) == "c::c1"
    assert second_hop(hits, {"a", "b", "c"}, section_of) is None
    assert second_hop([], set(), section_of) is None


def test_the_corpus_ranks_as_the_test_assumes(index: Index) -> None:
    first = [index.section_of(h.id) for h in index.search_chunks(RELATION.query, 5)]
    assert first[0] == "kanzaki"  # one hop at k=1 shows kanzaki only
    text = index.chunk("kanzaki::c1").text
    pivot = [index.section_of(h.id) for h in index.search_chunks(text, 3)]
    assert pivot[:2] == ["kanzaki", "orca"]


def test_two_hops_show_both_sections_of_a_relation_question(
    index: Index, encoder: LocalTokenizer
) -> None:
    planned = ResidentSet("planned", "planner", frozenset({"paint::c1"}), 1, 0, 1)
    rag = ResidentSet("rag-top1", "rag", frozenset(), 0, 0, 1)
    rows = [planned, rag]
    routing = RoutingSettings(hedge=0, spread=0, hops=1)
    one = evaluate_coverage(index, [RELATION], rows, encoder, source="t", routing=routing)
    routing = routing.model_copy(update={"hops": 2})
    two = evaluate_coverage(index, [RELATION], rows, encoder, source="t", routing=routing)
    assert [r.overall.coverage_all for r in one.results] == [0.0, 0.0]
    assert [r.overall.coverage for r in one.results] == [1.0, 1.0]
    assert two.results[0].overall.coverage_all == 1.0
    assert two.results[0].overall.mean_added_chunks == 2  # kanzaki, then orca
    source = f"manual.jsonl:{list(SECTIONS).index('orca') + 1}"
    orca_tokens = (
        encoder.count(f"[id: orca] Orca horn [source: {source}]\n{SECTIONS['orca'][1]}") + 1
    )
    extra = two.results[0].overall.mean_added_tokens - one.results[0].overall.mean_added_tokens
    assert extra == orca_tokens
    assert two.results[1].overall == one.results[1].overall  # plain RAG stays one hop
    assert (one.settings.hops, two.settings.hops) == (1, 2)


def test_the_second_hop_skips_sections_the_prefix_already_holds(index: Index) -> None:
    pivots = PivotRankings(index, 40)
    settings = RoutingSettings(k=1, hedge=0, spread=0, hops=2)
    hits = rank_queries(index, [RELATION.query], 40)[RELATION.query]
    assert hits[0].id == "kanzaki::c1"

    def added(prefix: frozenset[str], pinned: tuple[str, ...] = ()) -> tuple[str, ...]:
        routes = PrefixRoutes.build([("p0", prefix)], index.section_of)
        return route_question(
            hits,
            routes,
            settings,
            index.section_of,
            pin_dated=lambda _: pinned,
            pivot_hits=pivots,
        ).chunk_ids

    assert added(frozenset()) == ("kanzaki::c1", "orca::c1")
    assert added(frozenset({"orca::c1"}))[-1] not in {"orca::c1", "kanzaki::c1"}
    assert "orca::c1" not in added(frozenset(), pinned=("orca",))  # pinned whole: shown
    only_pinned = added(frozenset(), pinned=("kanzaki",))
    assert "kanzaki::c1" not in only_pinned  # a pinned section's chunk is not added again


@pytest.mark.parametrize("hops", [1, 2])
def test_router_and_eval_add_the_same_chunks(
    index: Index, encoder: LocalTokenizer, tmp_path: Path, hops: int
) -> None:
    capacity = CapacitySnapshot(
        model="tiny",
        host="test",
        max_model_len=200,
        kv_cache_tokens=200,
        block_size=16,
        is_hybrid=False,
        resident_budget_tokens=200,
        binding_constraint="max_model_len",
        reasoning="test",
    )
    log = [LogEntry(query="When are the towers painted white and red?", count=9)]
    plan = build_plan(index, log_mass(index, log), capacity, encoder, PlanOptions())
    assert "paint::c1" in plan.resident_chunk_ids()
    assert not plan.resident_chunk_ids() & {"kanzaki::c1", "orca::c1", "radio::c1"}
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    settings = ContextSettings(
        retriever="bm25", routing=RoutingSettings(hops=hops, k=1, hedge=0, spread=0)
    )
    builder = ContextBuilder(plan, index, settings)
    resident = {index.section_of(c) for c in plan.resident_chunk_ids()}
    for question in (RELATION, SIMPLE):
        routed = builder.retrieve(question.query)
        hits = rank_queries(index, [question.query], settings.routing.prefetch)[question.query]
        first = (hits[0].id,)
        # The hop by hand: the pivot's best-ranked chunk of a section not shown yet.
        pivot = index.search_chunks(index.chunk(first[0]).text, settings.routing.prefetch)
        shown = resident | {index.section_of(first[0])}
        extra = [h.id for h in pivot if index.section_of(h.id) not in shown][:1] if hops > 1 else []
        assert routed.chunk_ids == (*first, *extra), question.query
    assert builder.retrieve(RELATION.query).chunk_ids[-1] == (
        "orca::c1" if hops == 2 else "kanzaki::c1"
    )
