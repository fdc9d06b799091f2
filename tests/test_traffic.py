"""Traffic simulator: determinism, disjoint pools, empty-pool handling and the Zipf shape."""

from __future__ import annotations

import collections

import pytest

from residency.cli.spec import build, spec_of
from residency.errors import ConfigError
from residency.eval.coverage_options import TrafficOptions
from residency.eval.questions import Question
from residency.eval.traffic import (
    simulate_traffic,
    split_pools,
    zipf_weights,
)


def question_set(per_paragraph: dict[str, int]) -> list[Question]:
    """`n` distinct questions on each paragraph, typed by paragraph for traceability."""
    return [
        Question(
            query=f"{pid} についての質問 {i}", relevant_ids=(pid,), type="squad", id=f"{pid}-q{i}"
        )
        for pid, n in per_paragraph.items()
        for i in range(n)
    ]


PARAGRAPHS = {f"p{i:03d}": 1 + i % 5 for i in range(60)}  # 1..5 questions each


def test_zipf_weights_hand_computed() -> None:
    # s = 1: 1, 1/2, 1/3 over H = 11/6.
    assert zipf_weights(3, 1.0) == pytest.approx([6 / 11, 3 / 11, 2 / 11])
    assert sum(zipf_weights(1000, 1.1)) == pytest.approx(1.0)


def test_same_seed_same_traffic_other_seed_other_traffic() -> None:
    qs = question_set(PARAGRAPHS)
    a = simulate_traffic(qs, TrafficOptions(log_size=500, eval_size=300, seed=7))
    b = simulate_traffic(qs, TrafficOptions(log_size=500, eval_size=300, seed=7))
    c = simulate_traffic(qs, TrafficOptions(log_size=500, eval_size=300, seed=8))
    assert a == b
    assert a.popularity != c.popularity
    assert a.log != c.log


def test_log_and_eval_never_share_a_question() -> None:
    qs = question_set(PARAGRAPHS)
    t = simulate_traffic(qs, TrafficOptions(log_size=3000, eval_size=3000, seed=1))
    log_queries = {e.query for e in t.log}
    eval_queries = {q.query for q in t.eval_questions}
    assert log_queries.isdisjoint(eval_queries)
    assert len(log_queries) > 30  # both pools are really drawn from
    assert len(eval_queries) > 30
    assert sum(e.count for e in t.log) == 3000
    assert len({e.query for e in t.log}) == len(t.log)  # identical queries aggregated
    assert len(t.eval_questions) == 3000


def test_identical_texts_under_two_paragraphs_stay_in_one_pool() -> None:
    shared = "コンゴ共和国の首都は？"
    qs = [
        *question_set({"a": 3, "b": 3}),
        Question(query=shared, relevant_ids=("a",), id="a-dup"),
        Question(query=shared, relevant_ids=("b",), id="b-dup"),
    ]
    for seed in range(20):
        log, ev = split_pools(
            {
                "a": [q for q in qs if q.relevant_ids == ("a",)],
                "b": [q for q in qs if q.relevant_ids == ("b",)],
            },
            seed,
        )
        in_log = {q.query for pool in log.values() for q in pool}
        in_eval = {q.query for pool in ev.values() for q in pool}
        assert in_log.isdisjoint(in_eval), seed


@pytest.mark.parametrize("n", [2, 3, 4, 5], ids=lambda n: f"{n}-questions")
def test_pools_split_each_paragraph_in_half(n: int) -> None:
    qs = question_set({f"p{i}": n for i in range(40)})
    paragraphs = {f"p{i}": [q for q in qs if q.relevant_ids[0] == f"p{i}"] for i in range(40)}
    log, ev = split_pools(paragraphs, seed=3)
    sizes = {len(log[p]) for p in paragraphs}
    assert sizes <= {n // 2, (n + 1) // 2}
    assert all(len(log[p]) + len(ev[p]) == n for p in paragraphs)
    if n % 2:
        assert sizes == {n // 2, (n + 1) // 2}  # the odd one out goes either way, by seed


def test_single_question_paragraphs_are_drawn_only_where_their_question_went() -> None:
    qs = question_set({f"solo{i}": 1 for i in range(30)})
    t = simulate_traffic(qs, TrafficOptions(log_size=2000, eval_size=2000, seed=0))
    s = t.stats
    assert s.paragraphs_without_log_pool + s.paragraphs_without_eval_pool == 30
    assert s.log_pool_questions == s.paragraphs_without_eval_pool
    logged = {e.query for e in t.log}
    assert len(logged) <= s.log_pool_questions
    assert {q.query for q in t.eval_questions}.isdisjoint(logged)


def test_unanswerable_questions_take_no_part() -> None:
    qs = [*question_set({"a": 2, "b": 2}), Question(query="記載のない質問", relevant_ids=())]
    t = simulate_traffic(qs, TrafficOptions(log_size=50, eval_size=50))
    assert t.stats.excluded_unanswerable == 1
    assert t.stats.questions == 4
    assert all(q.relevant_ids for q in t.eval_questions)


def test_top_paragraph_frequency_follows_zipf_at_large_n() -> None:
    qs = question_set({f"p{i:03d}": 2 for i in range(200)})
    n = 200_000
    t = simulate_traffic(qs, TrafficOptions(zipf_s=1.1, log_size=n, eval_size=n, seed=5))
    expected = zipf_weights(200, 1.1)
    assert t.stats.top_paragraph_share == pytest.approx(expected[0])
    by_paragraph: collections.Counter[str] = collections.Counter()
    for entry in t.log:
        by_paragraph[entry.query.split()[0]] += entry.count
    eval_counts = collections.Counter(q.relevant_ids[0] for q in t.eval_questions)
    for counts in (by_paragraph, eval_counts):
        # Binomial sd at p ~ .18, n = 200K is ~.0009: 0.005 is over 5 sd.
        assert counts[t.popularity[0]] / n == pytest.approx(expected[0], abs=0.005)
        assert counts[t.popularity[1]] / n == pytest.approx(expected[1], abs=0.005)
        assert counts[t.popularity[9]] / n == pytest.approx(expected[9], abs=0.003)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"zipf": 0.0}, "^--zipf: .*greater than 0", id="zipf-zero"),
        pytest.param({"zipf": -1.1}, "^--zipf: .*greater than 0", id="zipf-negative"),
        pytest.param({"log_size": 0}, "^--log-size: .*greater than or equal to 1", id="log-size"),
        pytest.param(
            {"eval_size": 0}, "^--eval-size: .*greater than or equal to 1", id="eval-size"
        ),
        pytest.param({"seed": -1}, "^--seed: .*greater than or equal to 0", id="seed"),
    ],
)
def test_bad_options_name_the_flag(params: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build(spec_of(TrafficOptions), params)


@pytest.mark.parametrize(
    ("questions", "message"),
    [
        pytest.param(
            [Question(query="質問", relevant_ids=())], "no answerable", id="none-answerable"
        ),
        pytest.param(question_set({"a": 1}), "both pools", id="one-question"),
    ],
)
def test_unusable_question_sets_are_config_errors(questions: list[Question], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        simulate_traffic(questions, TrafficOptions(log_size=5, eval_size=5))
