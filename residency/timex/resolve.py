"""Reading the period a question asks about: collect mentions from every rule set, settle
overlaps, join "A から B" ranges and clip to today (see the package docstring for the rules)."""

from __future__ import annotations

import datetime as dt
import re

from residency.normalize import normalize_text
from residency.timex.ja_timex_rules import find_ja_timex
from residency.timex.mention import Mention
from residency.timex.occurrences import Span
from residency.timex.period import Period
from residency.timex.rules_en import find_en
from residency.timex.rules_ja import find_ja

# What may stand between the two ends of a range, and what may close it.
_RANGE_GAP = re.compile(r"\s*(?:から|より|〜|~|-|–|—|to|until|till|through|thru)\s*", re.I)
_BETWEEN = re.compile(r"\bbetween\s+$", re.I)
_AND = re.compile(r"\s*and\s*", re.I)
_RANGE_END = re.compile(r"\s*(?:まで|までの間|の間)")


def _settle(candidates: list[Mention], taken: list[Mention]) -> list[Mention]:
    """Add `candidates` to `taken`, leftmost-longest first, skipping any overlapping one."""
    out = list(taken)
    for m in sorted(candidates, key=lambda m: (m.start, m.start - m.end)):
        if all(m.end <= t.start or t.end <= m.start for t in out):
            out.append(m)
    return out


def _collect(text: str, today: dt.date) -> list[Mention]:
    """Resolvable mentions in text order; our rules win over ja-timex where they overlap
    (ja-timex reads 去年の冬 as just 去年)."""
    ours = [m for m in find_ja(text, today) + find_en(text, today) if m.resolve(today)]
    theirs = [m for m in find_ja_timex(text, today) if m.resolve(today)]
    return sorted(_settle(theirs, _settle(ours, [])), key=lambda m: m.start)


def _join(a: Mention, b: Mention, today: dt.date) -> Span | None:
    """The span from the start of A to the end of B, putting yearless ends in order.

    A bare B is read as its first occurrence starting on or after A's start: 12月25日から1月7日
    on 2025-01-03 -> 2024-12-25..2025-01-07 (clipped later to 01-03). A bare A after B is moved
    back before B: 3月から2024年1月 -> 2023-03-01..2024-01-31.
    """
    span_a, span_b = a.resolve(today), b.resolve(today)
    if span_a is None or span_b is None:
        return None
    if b.yearless:
        refs = (dt.date(span_a[0].year + k, 12, 31) for k in (0, 1) if span_a[0].year + k < 9999)
        later = [s for s in (b.resolve(ref) for ref in refs) if s and s[0] >= span_a[0]]
        if later:
            span_b = min(later)
    if span_b[1] < span_a[0] and a.yearless:
        span_a = a.resolve(span_b[0]) or span_a
    return min(span_a[0], span_b[0]), max(span_a[1], span_b[1])


def _range_end(text: str, a: Mention, b: Mention) -> int | None:
    """Where the range "A から B (まで)" / "from A to B" / "between A and B" ends, if A-B is one."""
    gap = text[a.end : b.start]
    is_range = _RANGE_GAP.fullmatch(gap) is not None or (
        _AND.fullmatch(gap) is not None and _BETWEEN.search(text[: a.start]) is not None
    )
    if not is_range:
        return None
    closing = _RANGE_END.match(text, b.end)
    return closing.end() if closing else b.end


def _clip(span: Span, today: dt.date) -> Span:
    """A period in progress ends today (今年 = Jan 1 - today); one wholly in the future stays."""
    start, end = span
    return (start, today) if start <= today < end else (start, end)


def resolve_period(text: str, today: dt.date) -> Period | None:
    """The period the question's first time expression names, relative to `today`; None when
    there is none we resolve."""
    norm = normalize_text(text)
    found = _collect(norm, today) if norm else []
    if not found:
        return None
    first = found[0]
    if len(found) > 1 and (end := _range_end(norm, first, found[1])) is not None:
        joined = _join(first, found[1], today)
        if joined is not None:
            start, stop = _clip(joined, today)
            return Period(start, stop, norm[first.start : end], "range")
    span = first.resolve(today)
    if span is None:  # _collect kept only resolvable ones; this keeps mypy and us honest
        return None
    start, stop = _clip(span, today)
    return Period(start, stop, norm[first.start : first.end], first.rule)
