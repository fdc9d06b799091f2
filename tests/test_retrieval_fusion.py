"""Weighted RRF: hand-computed scores, weights, deterministic ties, validation."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from residency.retrieval import FusedHit, Hit, fuse_rrf


def hits(*ids: str) -> list[Hit]:
    """Hits ranked in the order given, with made-up descending scores."""
    return [Hit(i, 10.0 - r, r) for r, i in enumerate(ids, 1)]


CASES = [
    pytest.param(
        {"bm25": hits("a", "b", "c"), "dense": hits("b", "d")},
        None,
        60,
        # b: 1/62 + 1/61; a: 1/61; d: 1/62; c: 1/63
        [("b", 1 / 62 + 1 / 61), ("a", 1 / 61), ("d", 1 / 62), ("c", 1 / 63)],
        id="equal-weights",
    ),
    pytest.param(
        {"bm25": hits("x", "y"), "dense": hits("z", "w", "x")},
        {"bm25": 0.7, "dense": 0.3},
        60,
        # the module docstring's example: x = 0.7/61 + 0.3/63 = 0.016237
        [("x", 0.7 / 61 + 0.3 / 63), ("y", 0.7 / 62), ("z", 0.3 / 61), ("w", 0.3 / 62)],
        id="weights-0.3-0.7",
    ),
    pytest.param(
        {"bm25": hits("b", "a"), "dense": hits("a", "b")},
        None,
        60,
        # exact tie, both best single rank 1 -> by id
        [("a", 1 / 61 + 1 / 62), ("b", 1 / 61 + 1 / 62)],
        id="tie-by-id",
    ),
    pytest.param(
        {"bm25": hits("p", "u", "q", "v"), "dense": hits("r", "s", "t", "v")},
        None,
        0,
        # k = 0: u = s = 1/2 tie v = 1/4 + 1/4; their best single rank (2) beats v's (4);
        # s and u (both best rank 2), like p and r (rank 1), then go by id
        [("p", 1.0), ("r", 1.0), ("s", 0.5), ("u", 0.5), ("v", 0.5), ("q", 1 / 3), ("t", 1 / 3)],
        id="tie-by-best-rank",
    ),
    pytest.param(
        {"bm25": hits("a"), "dense": hits("b")},
        {"bm25": 1.0, "dense": 0.0},
        60,
        [("a", 1 / 61), ("b", 0.0)],
        id="zero-weight-still-listed",
    ),
    pytest.param({"bm25": [], "dense": []}, None, 60, [], id="empty-lists"),
]


@pytest.mark.parametrize(("ranked", "weights", "k", "expected"), CASES)
def test_fuse_rrf_hand_computed(
    ranked: Mapping[str, list[Hit]],
    weights: Mapping[str, float] | None,
    k: int,
    expected: list[tuple[str, float]],
) -> None:
    fused = fuse_rrf(ranked, weights, k=k)
    assert [f.id for f in fused] == [i for i, _ in expected]
    assert [f.score for f in fused] == pytest.approx([s for _, s in expected], rel=1e-12)
    assert [f.rank for f in fused] == list(range(1, len(expected) + 1))


def test_fused_hit_keeps_each_retrievers_rank_and_score() -> None:
    fused = fuse_rrf({"bm25": hits("a", "b"), "dense": hits("b")})
    assert fused[0] == FusedHit(
        "b", 1 / 61 + 1 / 62, 1, {"bm25": 2, "dense": 1}, {"bm25": 8.0, "dense": 9.0}
    )
    assert fused[1].ranks == {"bm25": 1}
    assert fused[1].scores == {"bm25": 9.0}


def test_limit_truncates_after_ranking() -> None:
    fused = fuse_rrf({"bm25": hits("a", "b", "c"), "dense": hits("c")}, limit=2)
    assert [f.id for f in fused] == ["c", "a"]


def test_duplicate_id_in_one_list_counts_its_better_rank() -> None:
    fused = fuse_rrf({"bm25": [Hit("a", 3.0, 1), Hit("b", 2.0, 2), Hit("a", 1.0, 3)]})
    assert [(f.id, f.ranks, f.scores) for f in fused] == [
        ("a", {"bm25": 1}, {"bm25": 3.0}),
        ("b", {"bm25": 2}, {"bm25": 2.0}),
    ]
    assert fused[0].score == pytest.approx(1 / 61)


def test_weights_for_absent_retrievers_are_ignored() -> None:
    fused = fuse_rrf({"bm25": hits("a")}, {"bm25": 0.5, "dense": 0.5})
    assert fused[0].score == pytest.approx(0.5 / 61)


@pytest.mark.parametrize(
    ("weights", "k", "limit", "match"),
    [
        pytest.param({"bm25": 1.0}, 60, None, "no fusion weight", id="missing-weight"),
        pytest.param({"bm25": 1.0, "dense": -0.1}, 60, None, ">= 0", id="negative-weight"),
        pytest.param(None, -1, None, "RRF k", id="negative-k"),
        pytest.param(None, 60, 0, "positive int", id="zero-limit"),
    ],
)
def test_bad_arguments(
    weights: Mapping[str, float] | None, k: int, limit: int | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        fuse_rrf({"bm25": hits("a"), "dense": hits("b")}, weights, k=k, limit=limit)
