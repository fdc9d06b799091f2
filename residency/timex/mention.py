"""A time expression found in a question: its place in the normalised text, the rule that found
it, and how to resolve it against a reference day (the rule modules produce these)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from residency.timex.occurrences import Span, Yearly, most_recent

Resolver = Callable[[dt.date], Span | None]  # reference day -> the occurrence meant (unclipped)


@dataclass(frozen=True, slots=True)
class Mention:
    """One expression: [start, end) offsets in the normalised text, rule name, resolver.

    `yearless` marks a bare 3月 / 冬 / 正月 ("the most recent one by the reference day"): in a
    range its resolver is called again with another reference day to put both ends in order.
    """

    start: int
    end: int
    rule: str
    resolve: Resolver
    yearless: bool = False


def fixed(span: Span | None) -> Resolver:
    """A resolver that ignores the reference day (explicit or already-anchored periods)."""
    return lambda _ref: span


def recent(yearly: Yearly, fallback: Yearly | None = None) -> Resolver:
    """A resolver for a bare yearly period: the latest occurrence started by the reference day;
    failing that (2月30日 never exists), the latest of `fallback` (the month)."""

    def resolve(ref: dt.date) -> Span | None:
        span = most_recent(yearly, ref)
        if span is None and fallback is not None:
            span = most_recent(fallback, ref)
        return span

    return resolve


# A rule: a pattern, and what one of its matches means (None: the match is not a time).
Build = Callable[[re.Match[str], dt.date], "Mention | None"]
Rule = tuple[re.Pattern[str], Build]


def find_mentions(rules: Sequence[Rule], text: str, today: dt.date) -> list[Mention]:
    """Every match of every rule in `text` (overlaps are settled by the caller)."""
    found: list[Mention] = []
    for pattern, build in rules:
        for m in pattern.finditer(text):
            mention = build(m, today)
            if mention is not None:
                found.append(mention)
    return found
