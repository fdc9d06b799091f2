"""Several resident prefixes: the KV arithmetic (hand-computed), grouping of co-asked sections,
and multi-prefix plans on a real (BM25-only) index, routed per question."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from section_index import docs_index
from test_planning import TOPICS as PLANNING_TOPICS

from planner import InfeasiblePlanError
from planner.prefixes import concurrency_left, max_prefixes, split_budgets
from residency.context.builder import ContextBuilder
from residency.context.routing import choose_prefix
from residency.context.settings import ContextSettings
from residency.corpus.model import Chunk
from residency.errors import ConfigError
from residency.index import Index
from residency.planning.build import PlanOptions, build_plan
from residency.planning.grouping import co_asked, pack
from residency.planning.multi import build_prefix_plan
from residency.planning.plan_model import CapacitySnapshot, read_plan, write_plan
from residency.planning.run import index_closeness
from residency.query_log import LogEntry
from residency.tokenizer import LocalTokenizer

# The planning tests' manual, one section more.
TOPICS = {**PLANNING_TOPICS, "lens": "レンズは月に一度清掃し、ひびがあれば本部へ報告する。"}
LOG = [
    LogEntry(query="警報が鳴ったらどうする", count=40),
    LogEntry(query="風速何メートルで作業中止", count=25),
    LogEntry(query="蓄電池の交換周期", count=9),
    LogEntry(query="作業船の出航条件", count=5),
]


# RTX 4070 host of the README (Qwen3.5-4B FP8, block 528, window 29,040 after alignment):
# 132,021 - 3,696 = 128,325 KV tokens of room; four full windows, the fifth 23 blocks.
@pytest.mark.parametrize(
    ("count", "budgets"),
    [
        (1, (29_040,)),
        (4, (29_040,) * 4),
        (5, (29_040,) * 4 + (12_144,)),
    ],
    ids=["one", "four-full", "fifth-short"],
)
def test_split_budgets_rtx4070(count: int, budgets: tuple[int, ...]) -> None:
    split = split_budgets(
        count,
        kv_cache_tokens=132_021,
        window_tokens=29_040,
        headroom_tokens=3_696,
        block_size=528,
    )
    assert split.budgets_tokens == budgets
    assert max_prefixes(132_021, 29_040, 3_696) == 5


def test_split_budgets_with_a_shared_head_rtx4070() -> None:
    # The same host, a head of 36 blocks (19,008 tokens) in every prefix, cached once: the
    # first prefix costs 29,040, each further one 29,040 - 19,008 = 10,032. Of 128,325 tokens of
    # room, 99,285 are left after the first: nine more full windows (90,288), then 8,997 left,
    # which with the head make 27,984 (53 blocks); 21 tokens remain.
    split = split_budgets(
        11,
        kv_cache_tokens=132_021,
        window_tokens=29_040,
        headroom_tokens=3_696,
        block_size=528,
        shared_tokens=19_008,
    )
    assert split.budgets_tokens == (29_040,) * 10 + (27_984,)
    assert split.resident_kv_tokens == 128_304 <= 132_021 - 3_696
    assert max_prefixes(132_021, 29_040, 3_696, 19_008) == 11
    with pytest.raises(InfeasiblePlanError, match=r"at most 11 prefix"):
        split_budgets(
            12,
            kv_cache_tokens=132_021,
            window_tokens=29_040,
            headroom_tokens=3_696,
            block_size=528,
            shared_tokens=19_008,
        )


def test_too_many_prefixes_name_the_most_that_fit() -> None:
    with pytest.raises(InfeasiblePlanError, match=r"at most 5 prefix"):
        split_budgets(
            6, kv_cache_tokens=132_021, window_tokens=29_040, headroom_tokens=3_696, block_size=528
        )


def test_concurrency_left_counts_whole_blocks() -> None:
    # SmolLM2 on 1 GiB: 46,592 tokens; 4 prefixes of 4,096 hold 16,384; a request's own 3,392
    # tokens take 27 blocks of 128 = 3,456: (46,592 - 16,384) // 3,456 = 8.
    assert concurrency_left(46_592, 16_384, 3_392, 128) == 8


@dataclass(frozen=True)
class Item:
    id: str
    tokens: int
    value: float


def test_pack_keeps_co_asked_sections_together() -> None:
    items = [Item(x, 40, v) for x, v in (("a", 0.3), ("b", 0.3), ("c", 0.2), ("d", 0.2))]
    # a+c and b+d are asked together; the rooms hold two items each.
    affinity = {("a", "c"): 5.0, ("b", "d"): 5.0, ("a", "b"): 0.1}
    packing = pack(items, items, [80, 80], affinity, lambda i: i)
    assert sorted(sorted(b) for b in packing.bins) == [["a", "c"], ["b", "d"]]
    assert packing.value == pytest.approx(1.0)


def test_pack_keeps_a_documents_sections_together_before_affinity() -> None:
    # Two documents (x: a, c; y: b, d); affinity alone would pair a+b and c+d across them.
    items = [Item(x, 40, v) for x, v in (("a", 0.3), ("b", 0.3), ("c", 0.2), ("d", 0.2))]
    affinity = {("a", "b"): 5.0, ("c", "d"): 5.0}
    document = {"a": "x", "c": "x", "b": "y", "d": "y"}
    across = pack(items, items, [80, 80], affinity, lambda i: i)
    assert sorted(sorted(b) for b in across.bins) == [["a", "b"], ["c", "d"]]
    kept = pack(items, items, [80, 80], affinity, lambda i: i, (), document.__getitem__)
    assert sorted(sorted(b) for b in kept.bins) == [["a", "c"], ["b", "d"]]


def test_pack_splits_a_document_that_does_not_fit_one_prefix() -> None:
    # One document of three 40-token sections; rooms of 80: two stay together, one moves.
    items = [Item(x, 40, 0.3) for x in ("a", "b", "c")]
    packing = pack(items, items, [80, 80], {}, lambda i: i, (), lambda i: "doc")
    assert sorted(len(b) for b in packing.bins) == [1, 2]
    assert {i for b in packing.bins for i in b} == {"a", "b", "c"}


def test_co_asked_pairs_follow_the_rank_weights() -> None:
    pairs = co_asked(
        [LogEntry(query="q", count=2)], lambda q, k: ["x", "y", "z"][:k], depth=2
    )  # weights 1 and 1/4, normalised: 0.8 and 0.2; 2 x 0.8 x 0.2 = 0.32
    assert pairs == {("x", "y"): pytest.approx(0.32)}


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Index:
    body = "\n\n".join(f"## {name} {{#{name}}}\n\n{text * 4}" for name, text in TOPICS.items())
    manual = f"# マニュアル {{#top}}\n\n概要。\n\n{body}\n"
    return docs_index(tmp_path_factory.mktemp("prefixes"), {"manual.md": manual}, tokenizer_dir)


def capacity(kv_tokens: int, window: int) -> CapacitySnapshot:
    return CapacitySnapshot(
        model="tiny",
        host="test",
        max_model_len=window + 100,
        kv_cache_tokens=kv_tokens,
        block_size=16,
        is_hybrid=False,
        resident_budget_tokens=window,
        binding_constraint="max_model_len",
        reasoning="test",
        context_limit_tokens=window,
        concurrency_reserve_tokens=112,
        concurrent_requests=1,
        per_request_tokens=100,
    )


def _mass(index: Index) -> dict[str, float]:
    from residency.planning.build import log_mass

    return log_mass(index, LOG)


def test_one_forced_prefix_is_the_single_prefix_plan(index: Index, tokenizer_dir: Path) -> None:
    cap, enc = capacity(10_000, 300), LocalTokenizer(tokenizer_dir)
    single = build_plan(index, _mass(index), cap, enc, PlanOptions())
    plan = build_prefix_plan(index, _mass(index), {}, cap, enc, PlanOptions(), prefixes=1)
    assert plan.prefix == single.prefix
    assert plan.resident == single.resident
    assert [p.id for p in plan.prefixes] == ["p0"]
    assert plan.prefixes[0].sha256 == single.prefix.hash
    assert plan.arithmetic is not None
    assert plan.arithmetic.prefixes_chosen_by == "forced"


def test_auto_count_uses_the_kv_cache_and_routes_per_question(
    index: Index, tokenizer_dir: Path, tmp_path: Path
) -> None:
    cap, enc = capacity(10_000, 300), LocalTokenizer(tokenizer_dir)
    single = build_plan(index, _mass(index), cap, enc, PlanOptions())
    assert single.coverage.resident_sections < single.coverage.total_sections  # window too small
    affinity = index_closeness(index)
    plan = build_prefix_plan(index, _mass(index), affinity, cap, enc, PlanOptions(), None, 0)
    assert len(plan.prefixes) >= 2
    assert plan.coverage.resident_share > single.coverage.resident_share
    assert plan.arithmetic is not None
    assert plan.arithmetic.prefixes_chosen_by == "auto"
    for p in plan.prefixes:
        assert p.tokens == enc.count(p.prefix.text) <= 300
        assert p.sha256 == p.prefix.hash
    shares = [p.traffic_share for p in plan.prefixes]
    assert shares == sorted(shares, reverse=True)  # p0 is the busiest
    ids = [s for p in plan.prefixes for s in p.section_ids]
    assert len(ids) == len(set(ids))  # a section sits in one prefix
    assert plan.arithmetic.resident_kv_tokens == sum(-(-p.tokens // 16) * 16 for p in plan.prefixes)
    assert plan.arithmetic.headroom_tokens == 10_000 - plan.arithmetic.resident_kv_tokens
    # plan.json round-trips; a plan written before `prefixes` existed still loads as one prefix.
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    assert read_plan(path) == plan
    old = orjson.loads(path.read_bytes())
    for key in ("prefixes", "arithmetic"):
        del old[key]
    for key in ("context_limit_tokens", "concurrency_reserve_tokens"):
        del old["capacity"][key]
    path.write_bytes(orjson.dumps(old))
    legacy = read_plan(path)
    assert [p.id for p in legacy.all_prefixes()] == ["p0"]
    assert legacy.all_prefixes()[0].prefix == plan.prefix
    # The router picks the prefix holding the best-ranked evidence and its text goes first.
    builder = ContextBuilder(plan, index, ContextSettings(retriever="bm25"))
    routed = set()
    for p in plan.prefixes:
        for section in p.section_ids:
            topic = section.split("#")[-1]
            if topic not in TOPICS:
                continue
            r = builder.retrieve(TOPICS[topic][:20])
            assert r.prefix_id == p.id, (topic, r)
            assert builder.prefix_text(r.prefix_id) == p.prefix.text
            routed.add(p.id)
    assert len(routed) >= 2


def test_choose_prefix_takes_the_best_ranked_resident_hit() -> None:
    hits = [Chunk.model_construct(id=i) for i in ("tail", "c2", "c1")]
    assert choose_prefix(hits, {"c1": "p0", "c2": "p1"}, "p0") == "p1"
    assert choose_prefix(hits[:1], {"c1": "p0"}, "p0") == "p0"  # nothing resident: the busiest


def test_coverage_of_several_prefixes_counts_only_the_routed_one(
    index: Index, tokenizer_dir: Path
) -> None:
    from residency.context.routing import RoutingSettings
    from residency.eval.coverage import ResidentSet, evaluate_coverage
    from residency.eval.questions import Question

    cap, enc = capacity(10_000, 300), LocalTokenizer(tokenizer_dir)
    affinity = index_closeness(index)
    plan = build_prefix_plan(index, _mass(index), affinity, cap, enc, PlanOptions(), None, 0)
    assert len(plan.prefixes) >= 2
    home = {s: p.id for p in plan.prefixes for s in p.section_ids}
    names = [n for n in TOPICS if f"manual#{n}" in home]
    a = names[0]
    b = next(n for n in names if home[f"manual#{n}"] != home[f"manual#{a}"])
    questions = [Question(query=TOPICS[n][:20], relevant_ids=(f"manual#{n}",)) for n in names] + [
        Question(query=TOPICS[a][:20], relevant_ids=(f"manual#{b}",))
    ]  # gold elsewhere
    served = ResidentSet.from_plan(plan, k=0)
    assert served.name == "residency"
    flat = ResidentSet(
        name="union",
        strategy="planner",
        chunk_ids=plan.resident_chunk_ids(),
        sections=plan.coverage.resident_sections,
        prefix_tokens=plan.prefix.token_count,
        k=0,
    )
    # k=0, no hedge, no top sections: nothing is retrieved, so coverage is what the prompt's
    # prefix holds.
    routing = RoutingSettings(hedge=0, spread=0)
    report = evaluate_coverage(
        index, questions, [served, flat], enc, source="test", routing=routing
    )
    by_name = {r.name: r.overall for r in report.results}
    assert by_name["union"].coverage == pytest.approx(1.0)  # as if every prefix were in it
    # As served, the last question goes out with a's prefix and cannot see b's section.
    assert by_name["residency"].coverage == pytest.approx(len(names) / (len(names) + 1))


def test_hybrid_plans_count_prefixes_in_the_shared_block_pool(
    index: Index, tokenizer_dir: Path
) -> None:
    from planner.prefixes import POOL_COUNTING_RULE
    from residency.planning.plan_model import BlockPool

    # Block 16, 1 attention + 3 GDN groups, 58 blocks (57 usable): a 304-token window holds
    # 19 + 3 = 22 blocks, a request of 100 tokens 7 + 3 = 10; two windows leave 3 blocks, less
    # than one block of attention plus 3 states: exactly two prefixes fit.
    pool = BlockPool(num_blocks=58, attention_groups=1, state_groups=3, prefill_chunk_tokens=2048)
    base = capacity(10_000, 304)
    cap = base.model_copy(update={"is_hybrid": True, "block_pool": pool})
    enc = LocalTokenizer(tokenizer_dir)
    plan = build_prefix_plan(index, _mass(index), {}, cap, enc, PlanOptions(), prefixes=2)
    a = plan.arithmetic
    assert a is not None
    assert (a.pool_blocks, a.per_request_blocks) == (57, 10)
    assert a.resident_blocks == sum(-(-p.tokens // 16) + 3 for p in plan.prefixes)
    assert a.counting_rule == POOL_COUNTING_RULE
    with pytest.raises(ConfigError, match=r"--shared-tokens 100: a hybrid model"):
        build_prefix_plan(index, _mass(index), {}, cap, enc, PlanOptions(), 2, 100)
    with pytest.raises(InfeasiblePlanError, match=r"57 KV-cache blocks \(hybrid pool\)"):
        build_prefix_plan(index, _mass(index), {}, cap, enc, PlanOptions(), prefixes=3)
    # The token rule on the same KV tokens would have allowed far more.
    dense = build_prefix_plan(index, _mass(index), {}, base, enc, PlanOptions(), prefixes=3)
    assert len(dense.prefixes) == 3


def test_a_shared_head_leads_every_prefix_and_is_counted_once(
    index: Index, tokenizer_dir: Path, tmp_path: Path
) -> None:
    # A 420-token window; a head of 240 holds the instructions (155) and the most asked section.
    cap, enc = capacity(10_000, 420), LocalTokenizer(tokenizer_dir)
    affinity = index_closeness(index)
    plan = build_prefix_plan(index, _mass(index), affinity, cap, enc, PlanOptions(), 3, 240)
    a = plan.arithmetic
    assert a is not None
    assert len(plan.prefixes) == 3
    assert a.shared_kv_tokens > 0
    assert a.shared_kv_tokens % 16 == 0
    ids = [enc.encode(p.prefix.text) for p in plan.prefixes]
    assert all(x is not None for x in ids)
    first = ids[0] or []
    for other in ids[1:]:  # vLLM reuses these leading blocks: the same token ids in each
        assert (other or [])[: a.shared_kv_tokens] == first[: a.shared_kv_tokens]
    assert a.resident_kv_tokens == sum(-(-p.tokens // 16) * 16 for p in plan.prefixes) - (
        2 * a.shared_kv_tokens
    )
    assert a.headroom_tokens == 10_000 - a.resident_kv_tokens
    # The head's sections are in every prefix, in the same order; the rest in one prefix each.
    sets = [set(p.section_ids) for p in plan.prefixes]
    head = set.intersection(*sets)
    assert "manual#alarm" in head  # the most asked section
    rest = [s for p in plan.prefixes for s in p.section_ids if s not in head]
    assert len(rest) == len(set(rest))
    assert len({r.id for r in plan.resident}) == len(plan.resident)  # listed once in the plan
    # The router routes by the sections a prefix holds alone; a head section routes nowhere, and
    # every prefix shows it.
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    builder = ContextBuilder(plan, index, ContextSettings(retriever="bm25"))
    alarm = builder.retrieve(TOPICS["alarm"][:20])
    assert "警報" in builder.prefix_text(alarm.prefix_id)
    for p in plan.prefixes:
        for section in p.section_ids:
            topic = section.split("#")[-1]
            if section in head or topic not in TOPICS:
                continue
            assert builder.retrieve(TOPICS[topic][:20]).prefix_id == p.id, topic
    # A pinned section is in front of every question, even one the head's budget leaves out.
    pinned = PlanOptions(pins=("manual#lens",))
    with_pin = build_prefix_plan(index, _mass(index), affinity, cap, enc, pinned, 3, 160)
    assert all("manual#lens" in p.section_ids for p in with_pin.prefixes)
    # Without a head (--shared-tokens 0) no prefix shares a section.
    disjoint = build_prefix_plan(index, _mass(index), affinity, cap, enc, PlanOptions(), 3, 0)
    assert disjoint.arithmetic is not None
    assert disjoint.arithmetic.shared_kv_tokens == 0
    assert not set.intersection(*(set(p.section_ids) for p in disjoint.prefixes))


def test_keep_warm_touches_only_plans_with_several_prefixes(
    index: Index, tokenizer_dir: Path
) -> None:
    from residency.keep.token_count import policy_of

    cap, enc = capacity(10_000, 300), LocalTokenizer(tokenizer_dir)
    multi = build_prefix_plan(index, _mass(index), {}, cap, enc, PlanOptions(), None, 0)
    single = build_prefix_plan(index, _mass(index), {}, cap, enc, PlanOptions(), prefixes=1)
    a = multi.arithmetic
    assert a is not None
    assert len(multi.prefixes) >= 2
    policy = policy_of(multi, touch=True)
    assert policy.threshold_tokens == a.headroom_tokens // 2
    assert policy.expected == {p.id: p.tokens - 16 for p in multi.prefixes}
    assert len(set(policy.hashes.values())) == len(multi.prefixes)
    assert policy_of(multi, touch=False).threshold_tokens is None  # --no-keep-warm
    assert policy_of(single, touch=True).threshold_tokens is None  # every request uses it
