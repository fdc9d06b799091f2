"""The top sections shown wherever they live (`RoutingSettings.spread`): a question routed to one
prefix still sees the best chunk of each best-ranked section that prefix lacks; the router and the
coverage evaluation route through the same `route_question` (real files, a real BM25 index, a
real several-prefix plan, the real ContextBuilder)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from section_index import section_index

from residency.context.builder import ContextBuilder
from residency.context.routing import (
    PrefixRoutes,
    RoutingSettings,
    route_question,
    top_section_chunks,
)
from residency.context.settings import ContextSettings
from residency.eval.coverage import (
    ResidentSet,
    chunk_token_counts,
    evaluate_coverage,
    rank_queries,
)
from residency.eval.questions import Question
from residency.index import Index
from residency.planning.build import PlanOptions, log_mass
from residency.planning.multi import build_prefix_plan
from residency.planning.plan_model import CapacitySnapshot, ResidencyPlan, write_plan
from residency.planning.run import index_closeness
from residency.query_log import LogEntry
from residency.tokenizer import LocalTokenizer

SECTIONS = {
    "kanzaki": (
        "Kanzaki Lighthouse",
        "Kanzaki Lighthouse stands on the northern cape. Its fog horn is an Orca horn, fitted in "
        "2019; the keeper tests the fog horn every Monday.",
    ),
    "orca": ("Orca horn", "The Orca horn blasts twice each minute in fog, audible at four miles."),
    "unoshima": ("Unoshima Lighthouse", "Unoshima Lighthouse flashes white every five seconds."),
    "radio": ("Radio room", "The radio room answers on channel 16 around the clock."),
    "paint": ("Painting", "Towers are painted white and red every ten years."),
    "battery": ("Batteries", "Batteries are replaced every five years and their voltage logged."),
}
# Needs two sections: kanzaki (ranked first) and orca (ranked second), kept in different prefixes.
RELATION = Question(
    query="How often does the fog horn at Kanzaki Lighthouse sound in fog?",
    relevant_ids=("kanzaki", "orca"),
    type="relation",
)
QUERIES = [
    RELATION.query,
    "Which channel does the radio room answer on?",
    "How often are the towers painted?",
    "When are the batteries replaced, and what is logged?",
    "How does Unoshima Lighthouse flash?",
    "Which lighthouse has a fog horn tested on Mondays?",
]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Index:
    return section_index(tmp_path_factory.mktemp("top-sections"), SECTIONS, tokenizer_dir)


@dataclass(frozen=True)
class Hit:
    id: str


def section_of(chunk_id: str) -> str:
    return chunk_id.split("::")[0]


@pytest.mark.parametrize(
    ("ranking", "shown", "spread", "expected"),
    [
        pytest.param(["a::1", "a::2", "b::1", "c::1"], set(), 2, ("a::1", "b::1"), id="by-section"),
        pytest.param(["a::1", "b::1", "c::1"], {"a"}, 2, ("b::1",), id="shown-counts-in-top"),
        pytest.param(["a::1", "b::1", "c::1"], {"a", "b"}, 2, (), id="all-shown"),
        pytest.param(["a::2", "b::1", "a::1"], set(), 5, ("a::2", "b::1"), id="best-chunk"),
        pytest.param(["a::1", "b::1"], set(), 0, (), id="off"),
        pytest.param([], set(), 3, (), id="no-hits"),
    ],
)
def test_top_section_chunks(
    ranking: list[str], shown: set[str], spread: int, expected: tuple[str, ...]
) -> None:
    hits = [Hit(i) for i in ranking]
    assert top_section_chunks(hits, shown, section_of, spread) == expected


def test_route_question_adds_top_sections_after_the_route_s_own_chunks() -> None:
    # p0 holds a; the top hit and its runner-up are resident: route "resident", hedge b. The top
    # three sections are a, b, c: c is neither in p0 nor added yet, so its best chunk follows.
    routes = PrefixRoutes.build(
        [("p0", frozenset({"a::1", "a::2"})), ("p1", frozenset({"d::1"}))], section_of
    )
    hits = [Hit(i) for i in ("a::1", "a::2", "b::1", "c::2", "c::1", "d::1")]

    def routed(spread: int, pinned: tuple[str, ...] = ()) -> tuple[str, ...]:
        settings = RoutingSettings(k=5, margin=1, hedge=1, spread=spread)
        out = route_question(hits, routes, settings, section_of, pin_dated=lambda _: pinned)
        assert (out.prefix_id, out.route, out.dated_section_ids) == ("p0", "resident", pinned)
        return out.chunk_ids

    assert routed(0) == ("b::1",)
    assert routed(3) == ("b::1", "c::2")
    assert routed(4) == ("b::1", "c::2", "d::1")  # d lives in another prefix: added all the same
    assert routed(3, pinned=("c",)) == ("b::1",)  # a pinned section is shown whole already
    assert routed(3, pinned=("b",)) == ("c::2",)  # the hedge's chunk of a pinned section: dropped


def test_a_second_section_in_another_prefix_is_shown(index: Index, encoder: LocalTokenizer) -> None:
    hits = rank_queries(index, [RELATION.query], 40)[RELATION.query]
    assert [index.section_of(h.id) for h in hits[:2]] == ["kanzaki", "orca"]
    several = ResidentSet(
        "several",
        "planner",
        frozenset({"kanzaki::c1", "radio::c1", "orca::c1", "paint::c1"}),
        4,
        0,
        1,
        prefix_chunks=(
            ("p0", frozenset({"kanzaki::c1", "radio::c1"})),
            ("p1", frozenset({"orca::c1", "paint::c1"})),
        ),
    )
    rag = ResidentSet("rag-top1", "rag", frozenset(), 0, 0, 1)
    # margin 0, no hedge: the resident route adds nothing; only the top sections reach orca.
    before = RoutingSettings(margin=0, hedge=0, spread=0)
    after = before.model_copy(update={"spread": 2})
    rows = [several, rag]
    one = evaluate_coverage(index, [RELATION], rows, encoder, source="t", routing=before)
    two = evaluate_coverage(index, [RELATION], rows, encoder, source="t", routing=after)
    assert [r.overall.coverage_all for r in one.results] == [0.0, 0.0]
    assert [r.overall.coverage_all for r in two.results] == [1.0, 0.0]  # plain RAG: unchanged
    extra = two.results[0].overall.mean_added_tokens - one.results[0].overall.mean_added_tokens
    assert extra == chunk_token_counts(index, encoder)["orca::c1"]
    assert two.results[0].overall.mean_added_chunks == 1
    assert (one.settings.spread, two.settings.spread) == (0, 2)


def several_prefix_plan(index: Index, encoder: LocalTokenizer) -> ResidencyPlan:
    """A plan of several disjoint prefixes over the hand-made corpus (one or two sections each)."""
    window = 230
    capacity = CapacitySnapshot(
        model="tiny",
        host="test",
        max_model_len=window,
        kv_cache_tokens=4 * window,
        block_size=16,
        is_hybrid=False,
        resident_budget_tokens=window,
        binding_constraint="max_model_len",
        reasoning="test",
        context_limit_tokens=window,
    )
    log = [LogEntry(query=q, count=10 - i) for i, q in enumerate(QUERIES)]
    mass = log_mass(index, log)
    plan = build_prefix_plan(
        index, mass, index_closeness(index), capacity, encoder, PlanOptions(), None, 0
    )
    assert len(plan.all_prefixes()) >= 2
    return plan


@pytest.mark.parametrize("spread", [0, 2, 5])
def test_router_and_eval_route_alike_on_several_prefixes(
    index: Index, encoder: LocalTokenizer, tmp_path: Path, spread: int
) -> None:
    """Per question, what `eval coverage` counts (added tokens, every gold section visible) is
    what the router's ContextBuilder sends."""
    plan = several_prefix_plan(index, encoder)
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    routing = RoutingSettings(k=1, spread=spread)
    builder = ContextBuilder(plan, index, ContextSettings(retriever="bm25", routing=routing))
    tokens = chunk_token_counts(index, encoder)
    served = ResidentSet.from_plan(plan, routing.k)
    prefixes = {p.id: frozenset(c for i in p.resident for c in i.chunk_ids) for p in plan.prefixes}
    added_any = 0
    for query in QUERIES:
        routed = builder.retrieve(query)
        visible = prefixes[routed.prefix_id] | set(routed.chunk_ids)
        for gold in SECTIONS:
            question = Question(query=query, relevant_ids=(gold,))
            report = evaluate_coverage(
                index, [question], [served], encoder, source="t", routing=routing
            )
            m = report.results[0].overall
            assert m.mean_added_tokens == sum(tokens[c] for c in routed.chunk_ids), query
            shown = any(c.id in visible for c in index.chunks_of(gold))
            assert m.coverage_all == float(shown), (query, gold)
        added_any += len(routed.chunk_ids)
    assert added_any > 0  # the comparison is not vacuous


def test_several_prefixes_show_every_section_rag_top_k_shows(
    index: Index, encoder: LocalTokenizer
) -> None:
    """With the default spread (= k), whatever rag-top-k puts in front of a question is visible
    under several prefixes too: in the routed prefix or added."""
    plan = several_prefix_plan(index, encoder)
    settings = RoutingSettings()
    served = ResidentSet.from_plan(plan, settings.k)
    routes = served.routes(index.section_of)
    rankings = rank_queries(index, QUERIES, settings.prefetch)
    for query, hits in rankings.items():
        routed = route_question(hits, routes, settings, index.section_of)
        shown = routes.sections[routed.prefix_id] | {index.section_of(c) for c in routed.chunk_ids}
        rag = {index.section_of(h.id) for h in hits[: settings.k]}
        assert rag <= shown, query
