"""One question's outcome under one resident set (is its gold evidence visible, at what cost),
and the metrics of many; the rules are in `coverage`'s docstring."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from residency.eval.coverage_report import CoverageMetrics
from residency.routing import Route, RoutedQuestion


@dataclass(frozen=True, slots=True)
class Outcome:
    """One question under one resident set."""

    route: Route
    in_prefix: bool
    retrieved: bool  # not in prefix, and a gold chunk was added
    added_chunks: int
    added_tokens: int
    all_visible: bool = False  # every gold section visible (questions that need several)
    prompt_tokens: int = 0  # the routed prefix + added chunks + the question
    uncached_tokens: int = 0  # added chunks + the question (the prefix is cached)

    @property
    def covered(self) -> bool:
        """Gold evidence visible to the generator."""
        return self.in_prefix or self.retrieved


def question_outcome(
    routed: RoutedQuestion,
    resident: Collection[str],
    gold_sections: Sequence[Collection[str]],
    tokens: Mapping[str, int],
    *,
    pinned: Collection[str] = (),
    pinned_tokens: int = 0,
) -> Outcome:
    """Whether one routed question's gold evidence is visible, and at what cost (`resident`:
    the chunks of the prefix it went out with; `gold_sections`: the chunks of each gold
    section; `pinned`: the chunks of the dated sections pinned whole, costing `pinned_tokens`)."""
    added = routed.chunk_ids
    visible = {*added, *pinned}
    gold = {c for chunks in gold_sections for c in chunks}
    in_prefix = any(c in resident for c in gold)
    retrieved = not in_prefix and any(c in gold for c in visible)
    all_visible = bool(gold_sections) and all(
        any(c in resident or c in visible for c in chunks) for chunks in gold_sections
    )
    cost = sum(tokens[c] for c in added) + pinned_tokens
    n_pinned = len(routed.dated_section_ids)
    return Outcome(routed.route, in_prefix, retrieved, len(added) + n_pinned, cost, all_visible)


def summarize(outcomes: Sequence[Outcome]) -> CoverageMetrics:
    """Aggregate per-question outcomes (zeros for an empty set)."""
    n = len(outcomes)
    in_prefix = sum(o.in_prefix for o in outcomes)
    retrieved = sum(o.retrieved for o in outcomes)
    long_tail = n - in_prefix
    share = (lambda x: x / n) if n else (lambda x: 0.0)
    return CoverageMetrics(
        questions=n,
        coverage=share(in_prefix + retrieved),
        coverage_all=share(sum(o.all_visible for o in outcomes)),
        resident_share=share(in_prefix),
        retrieved_share=share(retrieved),
        long_tail_questions=long_tail,
        long_tail_recall=retrieved / long_tail if long_tail else None,
        route_resident_share=share(sum(o.route == "resident" for o in outcomes)),
        misrouted=sum(1 for o in outcomes if not o.covered and o.route == "resident"),
        mean_added_chunks=share(sum(o.added_chunks for o in outcomes)),
        mean_added_tokens=share(sum(o.added_tokens for o in outcomes)),
        mean_prompt_tokens=share(sum(o.prompt_tokens for o in outcomes)),
        mean_uncached_tokens=share(sum(o.uncached_tokens for o in outcomes)),
    )
