"""ja-timex for the Japanese dates it reads well, turned into mentions: absolute ones
(2024年3月5日, 令和6年3月, 2024/3/5, 2024-03-05, 2024年度, 三月五日) and relative ones (今日, 昨日,
一昨日, 先週, 今週, 先月, 今月, 先々月, 去年, 今年, 一昨年, 3日前, 2週間前, 3か月前, 半年前).

Measured on this machine: importing ja-timex (pendulum underneath) takes ~0.15 s and its first
parse ~45 ms (compiling its patterns), later parses well under 1 ms; it logs and warns nothing.
So it is imported on first use, not with `residency`. Its parser keeps the text being parsed on
itself and its instances share one number normaliser, so parses are serialised with a lock.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import re
import threading
from typing import Any

from residency.timex import occurrences as occ
from residency.timex.mention import Mention, fixed, recent

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_UNITS = ("year", "month", "week", "day")
_UNDATED = ("ac_century", "bc_century", "bc_year", "weekday", "season", "quarter")
# Every tag kept below names a year, month, week or day: a DATE has a calendar year or month
# (年, 月, or digits as in 2024/3/5; ja-timex reads kanji numerals as digits) or a fiscal year
# (年度); a BEFORE/NOW DURATION is 昨日, 先週, 今月, 去年, 3日前, 今世紀 (read as years) ... or
# おととし, the only kept pattern without one of 年月週日紀. A parse takes ~0.2 ms, most of a
# router request's own work,
# so questions with none of these characters (most of them) skip it;
# tests/test_timex.py checks the skip changes nothing on every question and corpus line we have.
_MAY_HOLD_DATE = re.compile(r"[\d〇一二三四五六七八九十百千万年月週日紀]|おととし")


@functools.cache
def _parser() -> Any:
    import ja_timex  # lazy: see the module docstring

    # No reference day: ours is applied to the parsed fields below (ja-timex's to_datetime
    # would put a bare 12月 in the reference year, i.e. in the future in June).
    parser = ja_timex.TimexParser()
    _compile_patterns(parser)
    return parser


def _compile_patterns(parser: Any) -> None:
    """Compile ja-timex's patterns once, in place.

    ja-timex hands its 248 patterns to `re.finditer` / `re.fullmatch` as strings, so every parse
    goes through `re`'s module cache. numpy.f2py's crackfortran sets `re._MAXCACHE = 50` for the
    whole process when it is imported, and scipy's array-API shim imports it (`from numpy import
    *` reaches numpy's lazy `f2py`): with scipy 1.17 in the process, every parse recompiled all
    248 patterns, ~100 ms instead of ~0.2 ms (measured on an Intel Xeon, 2 cores). Compiled
    patterns bypass the cache (`re._compile` returns a Pattern as it is).
    """
    for patterns in parser.all_patterns.values():
        for pattern in patterns:
            if isinstance(pattern.re_pattern, str):
                pattern.re_pattern = re.compile(pattern.re_pattern)


def _int(value: object) -> int | None:
    """A parsed field as an int; None for 'XX' (unknown), decimals and the like."""
    return int(value) if isinstance(value, str) and value.isdecimal() else None


def _date_mention(tag: Any, start: int, end: int) -> Mention | None:
    parsed: dict[str, str] = tag.parsed
    if "fiscal_year" in parsed:
        year = _int(parsed["fiscal_year"])
        span = occ.fiscal_year_span(year) if year is not None else None
        return Mention(start, end, "ja-timex", fixed(span))
    if any(key in parsed for key in _UNDATED):
        return None
    year = _int(parsed.get("calendar_year"))
    month = _int(parsed.get("calendar_month"))
    day = _int(parsed.get("calendar_day"))
    if month is None:
        # 2024年 -> the year; a bare 5日 is too often "5 days" or a count to mean a date.
        return Mention(start, end, "ja-timex", fixed(occ.year_span(year))) if year else None

    def month_of(y: int) -> occ.Span | None:
        return occ.month_span(y, month)

    def day_of(y: int) -> occ.Span | None:
        return occ.day_span(y, month, day) if day is not None else None

    if year is not None:
        # 2025年2月29日 -> February 2025: the nearest valid reading of an impossible day.
        span = month_of(year) if day is None else day_of(year) or month_of(year)
        return Mention(start, end, "ja-timex", fixed(span))
    if "月" not in (tag.raw_text or ""):
        return None  # a yearless 1/2 is as likely a fraction as January 2
    if day is None:
        return Mention(start, end, "ja-timex", recent(month_of), yearless=True)
    # 2月29日 -> the last leap day; 2月30日 -> the most recent February.
    return Mention(start, end, "ja-timex", recent(day_of, fallback=month_of), yearless=True)


def _duration_mention(tag: Any, start: int, end: int, today: dt.date) -> Mention | None:
    # 昨日 = P1D BEFORE, 今月 = P0M NOW, 3週間前 = P3W BEFORE; 3日後 (AFTER) and 3日間 (no mod)
    # are not periods asked about.
    parsed: dict[str, str] = tag.parsed
    if tag.mod not in ("BEFORE", "NOW") or parsed.get("half_suffix"):
        return None
    units = [(unit, parsed[unit]) for unit in _UNITS if parsed.get(unit)]
    if len(units) != 1:
        return None
    unit, value = units[0]
    n = _int(value)
    if n is None:
        return None
    return Mention(start, end, "ja-timex", fixed(occ.relative_span(unit, n, today)))


def find_ja_timex(text: str, today: dt.date) -> list[Mention]:
    """Mentions from ja-timex's DATE and BEFORE/NOW DURATION tags (times of day are ignored);
    a text that cannot hold one (see `_MAY_HOLD_DATE`) skips the parse."""
    if _MAY_HOLD_DATE.search(text) is None:
        return []
    return _parse(text, today)


def _parse(text: str, today: dt.date) -> list[Mention]:
    """`find_ja_timex` without the pre-check."""
    try:
        with _LOCK:
            tags = _parser().parse(text)
    except Exception:  # a third-party parser's bug must not fail the question; we log it
        log.warning("ja-timex failed on %r; using our own rules only", text, exc_info=True)
        return []
    found: list[Mention] = []
    for tag in tags:
        start, end = tag.raw_span or tag.span
        mention = None
        if tag.type == "DATE":
            mention = _date_mention(tag, start, end)
        elif tag.type == "DURATION":
            mention = _duration_mention(tag, start, end, today)
        if mention is not None:
            found.append(mention)
    return found
