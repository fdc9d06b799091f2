"""Placement of resident prefixes over a fleet of replicas: the pure assignment (hand-computed),
a fleet plan on a real (BM25-only) index that holds more than one replica's plan, the router's
pick among the replicas holding a prefix, each replica's warm plan, and the survivors' placement
when a replica is gone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from residency.errors import ConfigError
from residency.index import Index, IndexOptions, build_index, open_index
from residency.planning.build import PlanOptions, log_mass
from residency.planning.fleet import fleet_capacity, plan_fleet, room_tokens
from residency.planning.multi import build_prefix_plan
from residency.planning.placement import PrefixDemand, ReplicaRoom, place_prefixes
from residency.planning.plan_model import CapacitySnapshot, ResidencyPlan, read_plan, write_plan
from residency.planning.replicas import prefix_holders, replica_plan
from residency.query_log import LogEntry
from residency.serve.failover import survivor_placement
from residency.serve.telemetry import RouterMetrics
from residency.serve.upstreams import UpstreamPool
from residency.tokenizer import LocalTokenizer
from residency.vllm_client import open_session

ROOMS_900 = [ReplicaRoom(0, 900), ReplicaRoom(1, 900)]


def test_the_docstring_example_shards_three_prefixes_over_two_replicas() -> None:
    demands = [
        PrefixDemand("p0", 400, 0.5),
        PrefixDemand("p1", 400, 0.3),
        PrefixDemand("p2", 400, 0.2),
    ]
    a = place_prefixes(demands, ROOMS_900)
    assert a.held == (("p0",), ("p1", "p2"))
    assert a.used_tokens == (400, 800)
    assert a.loads == pytest.approx((0.5, 0.5))
    assert a.unplaced == ()


def test_a_hot_prefix_is_replicated_in_proportion_to_its_traffic() -> None:
    # p0 takes 0.8 of the traffic: ceil(0.8 * 2) = 2 copies; p1 (0.2) one.
    demands = [PrefixDemand("p0", 300, 0.8), PrefixDemand("p1", 300, 0.2)]
    a = place_prefixes(demands, ROOMS_900)
    assert a.held == (("p0",), ("p0", "p1"))
    assert a.copies("p0") == 2
    assert a.copies("p1") == 1
    assert a.loads == pytest.approx((0.4, 0.6))


def test_a_shared_head_is_counted_once_per_replica() -> None:
    # 3 prefixes of 400 tokens sharing 300: one replica of 700 holds 400 + 2 x 100 = 600.
    demands = [PrefixDemand(f"p{i}", 400, 1 / 3) for i in range(3)]
    a = place_prefixes(demands, [ReplicaRoom(0, 700)], shared_kv_tokens=300)
    assert a.held == (("p0", "p1", "p2"),)
    assert a.used_tokens == (600,)
    without = place_prefixes(demands, [ReplicaRoom(0, 700)])
    assert without.unplaced == ("p1", "p2")  # ties of traffic: by id


def test_a_prefix_larger_than_every_room_is_left_unplaced() -> None:
    a = place_prefixes([PrefixDemand("p0", 1000, 1.0)], ROOMS_900)
    assert a.held == ((), ())
    assert a.unplaced == ("p0",)


TOPICS = {
    name: text * 4
    for name, text in {
        "alarm": "警報が鳴ったら当番は十五分以内に監視室へ連絡し、主灯の状態を確認する。",
        "wind": "風速十五メートルを超えたら屋外作業を中止し、雷鳴から三十分は再開しない。",
        "battery": "蓄電池は五年ごとに交換し、交換後は電圧を記録簿に書く。",
        "boat": "作業船は波高一メートル以下でのみ出航し、救命胴衣を必ず着用する。",
        "paint": "灯塔の塗装は十年ごとに行い、色は白と赤の二色とする。",
        "lens": "レンズは月に一度清掃し、ひびがあれば本部へ報告する。",
    }.items()
}
LOG = [
    LogEntry(query="警報が鳴ったらどうする", count=40),
    LogEntry(query="風速何メートルで作業中止", count=25),
    LogEntry(query="蓄電池の交換周期", count=9),
    LogEntry(query="作業船の出航条件", count=5),
    LogEntry(query="灯塔の塗装の色", count=3),
    LogEntry(query="レンズの清掃", count=2),
]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Index:
    root = tmp_path_factory.mktemp("placement")
    docs = root / "docs"
    docs.mkdir()
    body = "\n\n".join(f"## {name} {{#{name}}}\n\n{text}" for name, text in TOPICS.items())
    (docs / "manual.md").write_text(f"# マニュアル {{#top}}\n\n概要。\n\n{body}\n", "utf-8")
    build_index(docs, root / "index", IndexOptions(dense=False), LocalTokenizer(tokenizer_dir))
    return open_index(root / "index")


def replica(kv_tokens: int, window: int = 400) -> CapacitySnapshot:
    return CapacitySnapshot(
        model="tiny",
        host="replica",
        max_model_len=window + 100,
        kv_cache_tokens=kv_tokens,
        block_size=16,
        is_hybrid=False,
        resident_budget_tokens=window,
        binding_constraint="kv_cache",
        reasoning="test",
        context_limit_tokens=window,
        concurrency_reserve_tokens=112,
        concurrent_requests=1,
        per_request_tokens=100,
    )


def test_fleet_capacity_adds_the_rooms_and_caps_a_prefix_at_the_smallest() -> None:
    assert room_tokens(replica(600)) == 488
    # No head: the window tiles the smallest room where that costs at most a quarter of it
    # (720 = 2 x 352, not 400 + 320; 480 = 2 x 240 would cut 400 by 40%: not tiled).
    fleet = fleet_capacity([replica(600), replica(1000)], shared_tokens=0)
    assert fleet.kv_cache_tokens == 488 + 888 + 112
    assert fleet.context_limit_tokens == 400
    assert fleet_capacity([replica(832), replica(1000)], 0).context_limit_tokens == 352
    assert fleet_capacity([replica(400), replica(1000)], 0).context_limit_tokens == 288
    # The default head (two thirds of 400 = 266 tokens: 15 whole blocks, the seam's less) is
    # held again by the second replica.
    headed = fleet_capacity([replica(600), replica(1000)])
    assert headed.context_limit_tokens == 400
    assert headed.kv_cache_tokens == 488 + 888 - 240 + 112


def test_two_replicas_hold_what_one_cannot(
    index: Index, tokenizer_dir: Path, tmp_path: Path
) -> None:
    enc, mass = LocalTokenizer(tokenizer_dir), log_mass(index, LOG)
    one = replica(600)

    def plan_once(capacity: CapacitySnapshot, count: int | None) -> ResidencyPlan:
        return build_prefix_plan(index, mass, {}, capacity, enc, PlanOptions(), count, 0)

    single = plan_once(one, None)
    fleet = plan_fleet(plan_once, [one, one], shared_tokens=0)
    assert fleet.placement is not None
    assert fleet.capacity == one  # each replica's capacity, as serve and warm check it
    assert fleet.resident_tokens() > 1.5 * single.resident_tokens()
    assert fleet.coverage.resident_share > single.coverage.resident_share
    for r in fleet.placement.replicas:
        assert r.resident_kv_tokens <= r.room_tokens == room_tokens(one)
        assert r.prefix_ids
    for p in fleet.all_prefixes():  # every prefix is somewhere
        assert fleet.placement.holders(p.id)
    path = tmp_path / "plan.json"
    write_plan(fleet, path)
    assert read_plan(path) == fleet


def test_pick_prefers_the_replicas_holding_the_prefix() -> None:
    async def main() -> None:
        async with open_session(5.0) as http:
            urls = [f"http://127.0.0.1:{9 + i}" for i in range(3)]
            pool = UpstreamPool(urls, http, RouterMetrics(), 5.0)
            for up in pool.upstreams:
                up.healthy = True
            a, b, c = pool.upstreams
            a.outstanding = 0
            b.outstanding = 3
            c.outstanding = 1
            assert pool.pick() is a  # no placement: least outstanding
            assert pool.pick(holders={1, 2}) is c  # least outstanding among the holders
            assert pool.pick(exclude=[c], holders={1, 2}) is b
            assert pool.pick(exclude=[b, c], holders={1, 2}) is a  # no holder left: any
            c.healthy = False
            assert pool.pick(holders={2}) is a

    asyncio.run(main())


def test_a_replica_is_warmed_with_its_own_prefixes(index: Index, tokenizer_dir: Path) -> None:
    enc, mass = LocalTokenizer(tokenizer_dir), log_mass(index, LOG)
    one = replica(600)

    def plan_once(capacity: CapacitySnapshot, count: int | None) -> ResidencyPlan:
        return build_prefix_plan(index, mass, {}, capacity, enc, PlanOptions(), count, 0)

    fleet = plan_fleet(plan_once, [one, one], shared_tokens=0)
    assert fleet.placement is not None
    seen: set[str] = set()
    for position in (0, 1):
        held = replica_plan(fleet, position)
        assert held is not None
        ids = [p.id for p in held.all_prefixes()]
        assert ids == list(fleet.placement.replicas[position].prefix_ids)
        assert held.prefix == held.all_prefixes()[0].prefix
        assert {r.id for r in held.resident} == {r.id for p in held.prefixes for r in p.resident}
        for pid in ids:
            assert position in (prefix_holders(fleet, pid) or ())
        seen.update(ids)
    assert seen == {p.id for p in fleet.all_prefixes()}
    single = plan_once(one, None)
    assert replica_plan(single, 5) is single  # no placement: every replica holds every prefix
    assert prefix_holders(single, "p0") is None
    with pytest.raises(ConfigError, match="2 replicas"):
        replica_plan(fleet, 2)


def test_a_dead_replicas_prefixes_go_to_the_survivor_within_its_room(
    index: Index, tokenizer_dir: Path
) -> None:
    enc, mass = LocalTokenizer(tokenizer_dir), log_mass(index, LOG)

    def plan_once(capacity: CapacitySnapshot, count: int | None) -> ResidencyPlan:
        return build_prefix_plan(index, mass, {}, capacity, enc, PlanOptions(), count, 0)

    big = replica(2000)  # room 1,888: it can take the other replica's prefixes too
    fleet = plan_fleet(plan_once, [replica(600), big], shared_tokens=0)
    assert fleet.placement is not None
    assert survivor_placement(fleet, {0, 1}) is None  # all alive: the plan's own placement
    own = set(fleet.placement.replicas[1].prefix_ids)
    orphans = set(fleet.placement.replicas[0].prefix_ids) - own
    after = survivor_placement(fleet, {1})
    assert after is not None
    assert [r.position for r in after.replicas] == [1]
    assert set(after.replicas[0].prefix_ids) == own | orphans
    tight = plan_fleet(plan_once, [replica(600), replica(600)], shared_tokens=0)
    assert tight.placement is not None
    left = survivor_placement(tight, {0})
    assert left is not None
    survivor = tight.placement.replicas[0]
    kept = set(left.replicas[0].prefix_ids)
    assert set(survivor.prefix_ids) <= kept  # what it holds it keeps
    extra_tokens = sum(
        p.tokens for p in tight.all_prefixes() if p.id in kept - set(survivor.prefix_ids)
    )
    assert survivor.resident_kv_tokens + extra_tokens <= survivor.room_tokens
