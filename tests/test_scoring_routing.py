"""Pure scoring (attribution, smoothing) and the routing decision, with hand-computed values."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from residency.context.routing import decide_route
from residency.planning.scoring import attribute_queries, score_sections
from residency.query_log import LogEntry


def test_attribution_splits_counts_by_inverse_square_rank() -> None:
    ranked = {"q1": ["a", "b", "c"], "q2": ["b"]}
    mass = attribute_queries(
        [LogEntry(query="q1", count=49), LogEntry(query="q2", count=3)],
        lambda query, k: ranked[query][:k],
        depth=3,
    )
    # weights 1, 1/4, 1/9 normalised by 49/36: a 36, b 9 + 3, c 4.
    assert mass == pytest.approx({"a": 36.0, "b": 12.0, "c": 4.0})


def test_smoothing_gives_unseen_sections_the_prior() -> None:
    scores = score_sections([("a", 10), ("b", 20), ("c", 40), ("d", 10)], {"a": 3.0}, 1.0)
    p = {s.section_id: s.probability for s in scores}
    # (mass + 1/4) / (3 + 1)
    assert p == pytest.approx({"a": 0.8125, "b": 0.0625, "c": 0.0625, "d": 0.0625})
    assert sum(p.values()) == pytest.approx(1.0)
    assert {s.section_id: s.frequency for s in scores}["a"] == 1.0
    assert scores[1].density == pytest.approx(0.0625 / 20)


def test_empty_log_is_uniform() -> None:
    scores = score_sections([("a", 5), ("b", 50)], {}, 1.0)
    assert [s.probability for s in scores] == [0.5, 0.5]


@dataclass(frozen=True)
class H:
    id: str


@pytest.mark.parametrize(
    ("ranking", "margin", "route", "added"),
    [
        pytest.param(["r1", "r2", "t1", "t2"], 1, "resident", ("t1",), id="top-two-resident"),
        pytest.param(["r1", "t1", "r2"], 1, "long_tail", ("t1",), id="long-tail-runner-up"),
        pytest.param(["r1", "t1", "r2"], 0, "resident", ("t1",), id="margin-zero-trusts-top"),
        pytest.param(["r1", "r2"], 1, "resident", (), id="nothing-to-hedge-with"),
        pytest.param(["t1", "r1", "t2"], 1, "long_tail", ("t1", "t2"), id="long-tail-top"),
        pytest.param([], 1, "long_tail", (), id="no-hits"),
    ],
)
def test_decide_route(ranking: list[str], margin: int, route: str, added: tuple[str, ...]) -> None:
    decision = decide_route([H(i) for i in ranking], {"r1", "r2"}, k=5, margin=margin)
    assert decision.route == route
    assert decision.long_tail_chunk_ids == added


def test_route_adds_at_most_k_chunks() -> None:
    hits = [H(f"t{i}") for i in range(10)]
    assert len(decide_route(hits, set(), k=3).long_tail_chunk_ids) == 3
    assert (
        decide_route([H("r1"), H("r2"), H("t1")], {"r1", "r2"}, hedge=0).long_tail_chunk_ids == ()
    )
    with pytest.raises(ValueError, match="k, margin and hedge"):
        decide_route(hits, set(), k=-1)
