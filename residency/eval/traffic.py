"""Simulated traffic over a SQuAD-style question set: a query log for the planner and disjoint
evaluation traffic, both drawn with Zipf popularity over the gold paragraphs
(docs/design/evaluation.md).

How a run is drawn (pure given the questions and `TrafficOptions`; every random choice comes from
a `random.Random` seeded with the seed and a purpose string, so one seed gives one run anywhere):

1. **Paragraphs** are the gold sections of the answerable questions (a question's first relevant
   id; SQuAD has exactly one), in first-appearance order. Unanswerable questions (no relevant
   ids) take no part and are counted in the stats.
2. **Popularity**: a seeded permutation of the paragraphs; the paragraph at rank r (from 1) is
   asked with probability proportional to 1 / r^s (Zipf, s = `zipf_s`, default 1.1).
3. **Pools**: each paragraph's distinct question texts are shuffled and split in half between the
   log pool and the eval pool; an odd one out (a paragraph with one question included) goes to a
   pool by a seeded coin flip. Identical texts are one unit across the whole set (JSQuAD repeats
   a few, e.g. 'コンゴ共和国の首都は？' under two paragraphs): a text already placed elsewhere keeps
   its pool, so no question text is ever in both pools (hence no question id either).
4. **Empty pools**: a paragraph whose log pool is empty is never drawn for the log, and likewise
   for evaluation; the draws are Zipf over the paragraphs with a non-empty pool, renormalised
   (rejection sampling: the others keep their rank weights). Such a paragraph still receives
   evaluation traffic the planner never saw: the unseen-question case the prior and the
   retrieval fallback exist for.
5. **Draws**: `log_size` log draws (paragraph by Zipf, then a question of its log pool uniformly)
   become `LogEntry`s with identical queries aggregated into one entry with their count, in order
   of first draw; `eval_size` eval draws become question records (repeats kept: coverage is
   measured over traffic, so a popular question weighs as often as it is asked).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from residency.errors import ConfigError
from residency.eval.coverage_options import TrafficOptions
from residency.eval.questions import Question
from residency.query_log import LogEntry


class TrafficStats(BaseModel):
    """What the simulation had to work with and what it drew."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    paragraphs: int = Field(ge=1, description="Gold paragraphs (popularity ranks).")
    questions: int = Field(ge=1, description="Answerable questions split into the pools.")
    excluded_unanswerable: int = Field(ge=0, description="Questions without relevant ids.")
    log_pool_questions: int = Field(ge=1, description="Questions in the log pool.")
    eval_pool_questions: int = Field(ge=1, description="Questions in the eval pool.")
    paragraphs_without_log_pool: int = Field(ge=0, description="Never drawn for the log.")
    paragraphs_without_eval_pool: int = Field(ge=0, description="Never drawn for evaluation.")
    log_distinct_queries: int = Field(ge=1, description="Distinct queries in the log.")
    eval_distinct_questions: int = Field(ge=1, description="Distinct questions drawn for eval.")
    top_paragraph_share: float = Field(
        ge=0, le=1, description="Expected share of traffic on the rank-1 paragraph, 1 / H(n, s)."
    )


class SimulatedTraffic(BaseModel):
    """A query log for the planner and evaluation traffic from disjoint question pools."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    options: TrafficOptions = Field(description="How it was drawn.")
    stats: TrafficStats = Field(description="Pools and draws.")
    popularity: tuple[str, ...] = Field(description="Paragraph ids, most popular first.")
    log: tuple[LogEntry, ...] = Field(description="Aggregated log entries, in first-draw order.")
    eval_questions: tuple[Question, ...] = Field(description="Eval draws, repeats kept.")


def zipf_weights(n: int, s: float) -> list[float]:
    """Normalised Zipf probabilities of ranks 1..n: p(r) = r^-s / H(n, s).

    >>> [round(p, 4) for p in zipf_weights(3, 1.0)]   # 1, 1/2, 1/3 over 11/6
    [0.5455, 0.2727, 0.1818]
    """
    raw = [r**-s for r in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def _rng(seed: int, purpose: str) -> random.Random:
    # str seeds are hashed with sha512 (random.seed version 2): stable across runs and machines.
    return random.Random(f"residency.traffic:{seed}:{purpose}")


def _paragraphs(answerable: Sequence[Question]) -> dict[str, list[Question]]:
    """Questions per gold paragraph (first relevant id), paragraphs in first-appearance order."""
    out: dict[str, list[Question]] = {}
    for q in answerable:
        out.setdefault(q.relevant_ids[0], []).append(q)
    return out


def split_pools(
    paragraphs: dict[str, list[Question]], seed: int
) -> tuple[dict[str, list[Question]], dict[str, list[Question]]]:
    """Each paragraph's questions into (log pool, eval pool): half and half by distinct text."""
    rng = _rng(seed, "pools")
    pool_of_text: dict[str, str] = {}
    for questions in paragraphs.values():
        texts = list(dict.fromkeys(q.query for q in questions))
        placed = [t for t in texts if t in pool_of_text]
        free = [t for t in texts if t not in pool_of_text]
        rng.shuffle(free)
        half, odd = divmod(len(texts), 2)
        target = half + (odd if rng.random() < 0.5 else 0)
        need = min(max(target - sum(pool_of_text[t] == "log" for t in placed), 0), len(free))
        for i, text in enumerate(free):
            pool_of_text[text] = "log" if i < need else "eval"
    log = {p: [q for q in qs if pool_of_text[q.query] == "log"] for p, qs in paragraphs.items()}
    ev = {p: [q for q in qs if pool_of_text[q.query] == "eval"] for p, qs in paragraphs.items()}
    return log, ev


def _draw(
    rng: random.Random,
    popularity: Sequence[str],
    weights: Sequence[float],
    pools: dict[str, list[Question]],
    n: int,
) -> list[Question]:
    """`n` draws: a paragraph by Zipf among those with a non-empty pool, then one of its pool."""
    ranked = [(p, w) for p, w in zip(popularity, weights, strict=True) if pools[p]]
    cum = list(itertools.accumulate(w for _, w in ranked))
    chosen = rng.choices([p for p, _ in ranked], cum_weights=cum, k=n)
    return [rng.choice(pools[p]) for p in chosen]


def _aggregate(draws: Sequence[Question]) -> tuple[LogEntry, ...]:
    counts: dict[str, int] = {}
    for q in draws:
        counts[q.query] = counts.get(q.query, 0) + 1
    return tuple(LogEntry(query=text, count=c) for text, c in counts.items())


def simulate_traffic(questions: Sequence[Question], options: TrafficOptions) -> SimulatedTraffic:
    """Draw a query log and evaluation traffic from disjoint pools (see the module docstring)."""
    answerable = [q for q in questions if q.relevant_ids]
    if not answerable:
        raise ConfigError(
            f"no answerable question among {len(questions)} (every relevant_ids is empty): "
            "traffic needs gold paragraphs"
        )
    paragraphs = _paragraphs(answerable)
    popularity = list(paragraphs)
    _rng(options.seed, "popularity").shuffle(popularity)
    weights = zipf_weights(len(popularity), options.zipf_s)
    log_pools, eval_pools = split_pools(paragraphs, options.seed)
    log_n = sum(map(len, log_pools.values()))
    eval_n = sum(map(len, eval_pools.values()))
    if log_n == 0 or eval_n == 0:
        raise ConfigError(
            f"{len(answerable)} answerable question(s) split into {log_n} for the log and "
            f"{eval_n} for evaluation: both pools need at least one; add questions"
        )
    log_draws = _draw(_rng(options.seed, "log"), popularity, weights, log_pools, options.log_size)
    eval_draws = _draw(
        _rng(options.seed, "eval"), popularity, weights, eval_pools, options.eval_size
    )
    log = _aggregate(log_draws)
    stats = TrafficStats(
        paragraphs=len(paragraphs),
        questions=len(answerable),
        excluded_unanswerable=len(questions) - len(answerable),
        log_pool_questions=log_n,
        eval_pool_questions=eval_n,
        paragraphs_without_log_pool=sum(1 for p in log_pools.values() if not p),
        paragraphs_without_eval_pool=sum(1 for p in eval_pools.values() if not p),
        log_distinct_queries=len(log),
        eval_distinct_questions=len({(q.id, q.query) for q in eval_draws}),
        top_paragraph_share=weights[0],
    )
    return SimulatedTraffic(
        options=options,
        stats=stats,
        popularity=tuple(popularity),
        log=log,
        eval_questions=tuple(eval_draws),
    )
