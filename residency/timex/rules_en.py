"""Rules for English time expressions (New Year, year-end, seasons, month names, yesterday,
last week, N days ago ...). Month names must be capitalised ("march" and "may" are verbs), and a
bare "May" or "fall" needs a preposition, qualifier, day or year to count."""

from __future__ import annotations

import datetime as dt
import re
from functools import partial

from residency.timex import occurrences as occ
from residency.timex.mention import Build, Mention, Rule, find_mentions, fixed, recent

_MONTH_NAMES = "January February March April May June July August September October November "
_MONTH_NAMES += "December"
_MONTHS = {name: i for i, name in enumerate(_MONTH_NAMES.split(), start=1)}  # not locale-bound
_MONTH = "(?-i:(?P<mon>" + "|".join(_MONTHS) + "))"
_SEASONS = {"spring": "spring", "summer": "summer", "autumn": "autumn", "fall": "autumn"}
_SEASONS["winter"] = "winter"
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
_NUMBERS |= {"seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}
_LAST = {"last", "previous", "past"}
_ORD = r"(?:st|nd|rd|th)?"
# A bare "May" is the month only after a word that introduces a date ("from March to May").
_MAY_CONTEXT = re.compile(r"\b(?:to|and|until|till|through|from|between|since)\s+$", re.I)


def _qualified(m: re.Match[str], today: dt.date, rule: str, yearly: occ.Yearly) -> Mention:
    """A yearly period with an optional qualifier or year: "last X" -> the latest one already
    over (English "last winter" in January is the winter before the current one); "this X" /
    "in X" / bare -> the latest one started by today; "X 2024" -> that year's."""
    groups = m.groupdict()
    qual = (groups.get("qual") or "").lower()
    if groups.get("abs"):
        return Mention(m.start(), m.end(), rule, fixed(yearly(int(groups["abs"]))))
    if qual in _LAST:
        return Mention(m.start(), m.end(), rule, fixed(occ.last_completed(yearly, today)))
    return Mention(m.start(), m.end(), rule, recent(yearly), yearless=not qual)


def _new_year(m: re.Match[str], today: dt.date) -> Mention:
    """New Year / New Year's Day -> Jan 1-7, like 正月."""
    return _qualified(m, today, "shogatsu", partial(occ.fixed_span, start=(1, 1), end=(1, 7)))


def _new_years_eve(m: re.Match[str], today: dt.date) -> Mention:
    """New Year's Eve -> Dec 31, the most recent one."""
    return _qualified(m, today, "omisoka", partial(occ.fixed_span, start=(12, 31), end=(12, 31)))


def _year_end(rule: str, bounds: tuple[tuple[int, int], tuple[int, int]]) -> Build:
    """year-end (and New Year): "last" -> last year's, "this" -> this year's, a year -> that
    year's, bare -> DESIGN §7 (the previous year's when asked in Jan-Jun)."""
    yearly = partial(occ.fixed_span, start=bounds[0], end=bounds[1])

    def build(m: re.Match[str], today: dt.date) -> Mention:
        groups = m.groupdict()
        qual = (groups.get("qual") or "").lower()
        if groups.get("abs"):
            return Mention(m.start(), m.end(), rule, fixed(yearly(int(groups["abs"]))))
        if qual in ("last", "this"):
            year = today.year - (qual == "last")
            return Mention(m.start(), m.end(), rule, fixed(yearly(year)))

        def by_month(ref: dt.date) -> occ.Span | None:
            return yearly(occ.year_end_year(ref))

        return Mention(m.start(), m.end(), rule, by_month, yearless=True)

    return build


def _season(m: re.Match[str], today: dt.date) -> Mention | None:
    """last winter / this winter / in the winter / winter 2024 (see `_qualified`)."""
    word = m["season"].lower()
    if word == "fall" and not (m["qual"] or m["abs"]):
        return None  # "did the lamp fall" is not autumn
    return _qualified(m, today, "season", partial(occ.season_span, _SEASONS[word]))


def _month(m: re.Match[str], today: dt.date) -> Mention | None:
    """March / in March / March 2024 / March 3 / 3 March 2024 / last March / this March."""
    groups = m.groupdict()
    qual = (groups.get("qual") or "").lower()
    if m["mon"] == "May" and not (
        qual or groups.get("d") or groups.get("y") or _MAY_CONTEXT.search(m.string[: m.start()])
    ):
        return None  # "May I ..." is not the month
    month = _MONTHS[m["mon"]]
    day = int(groups["d"]) if groups.get("d") else None
    rule = "month" if day is None else "day"

    def month_of(year: int) -> occ.Span | None:
        return occ.month_span(year, month)

    def day_of(year: int) -> occ.Span | None:
        return occ.day_span(year, month, day) if day is not None else None

    def yearly(year: int) -> occ.Span | None:
        # February 30, 2024 -> February 2024: the nearest valid reading of an impossible day.
        return month_of(year) if day is None else day_of(year) or month_of(year)

    if groups.get("y"):
        return Mention(m.start(), m.end(), rule, fixed(yearly(int(groups["y"]))))
    if qual == "this":
        return Mention(m.start(), m.end(), rule, fixed(yearly(today.year)))
    if qual == "last":
        span = occ.last_completed(yearly if day is None else day_of, today)
        return Mention(m.start(), m.end(), rule, fixed(span or occ.last_completed(month_of, today)))
    if day is None:
        return Mention(m.start(), m.end(), rule, recent(month_of), yearless=True)
    return Mention(m.start(), m.end(), rule, recent(day_of, fallback=month_of), yearless=True)


def _year(m: re.Match[str], today: dt.date) -> Mention:
    """in 2024 / during 2024 -> the calendar year."""
    return Mention(m.start(), m.end(), "year", fixed(occ.year_span(int(m["y"]))))


def _relative(n_default: int | None) -> Build:
    """yesterday, last week, this month, the week before last, 3 days ago, a month ago."""

    def build(m: re.Match[str], today: dt.date) -> Mention:
        groups = m.groupdict()
        unit = (groups.get("unit") or "day").lower()
        if n_default is not None:
            n = n_default
        elif groups.get("qual"):
            n = 0 if groups["qual"].lower() == "this" else 1
        else:
            word = groups["n"].lower()
            n = _NUMBERS[word] if word in _NUMBERS else int(word)
        span = occ.relative_span(unit, n, today)
        return Mention(m.start(), m.end(), f"relative-{unit}", fixed(span))

    return build


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


_UNIT = r"(?P<unit>day|week|month|year)"
_COUNT = r"(?P<n>\d{1,9}|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
_RULES: tuple[Rule, ...] = (
    (_rx(r"\bnew year['’]?s eve\b"), _new_years_eve),
    (
        _rx(r"\b(?:the )?year[- ]?end (?:and|&) new year(?:['’]?s)?(?: holidays?)?\b"),
        _year_end("nenmatsu-nenshi", occ.YEAR_END_NEW_YEAR),
    ),
    (
        _rx(
            r"\b(?:(?P<qual>last|this|previous|past) )?new year(?:['’]?s)?(?: day| holidays?)?"
            r"(?:,? (?:of )?(?P<abs>\d{4})\b)?"
        ),
        _new_year,
    ),
    (
        _rx(r"\b(?:the )?end of (?:(?P<qual>last|this|the) year\b|(?P<abs>\d{4})\b)"),
        _year_end("nenmatsu", occ.YEAR_END),
    ),
    (
        _rx(r"\b(?:(?P<qual>last|this) |(?P<abs>\d{4}) |the )?year[- ]?end\b"),
        _year_end("nenmatsu", occ.YEAR_END),
    ),
    (
        _rx(
            r"\b(?:(?P<qual>last|this|previous|past)\s+|(?:in|during)\s+(?:the\s+)?)?"
            r"(?P<season>spring|summer|autumn|fall|winter)\b(?:,?\s+(?:of\s+)?(?P<abs>\d{4})\b)?"
        ),
        _season,
    ),
    (_rx(rf"\b(?P<d>\d{{1,2}}){_ORD}\s+(?:of\s+)?{_MONTH}\b(?:,?\s+(?P<y>\d{{4}})\b)?"), _month),
    (
        _rx(
            rf"\b(?:(?P<qual>last|this|in|during|of|early|late|mid)[\s-]+)?{_MONTH}\b"
            rf"(?:\s+(?P<d>\d{{1,2}}){_ORD}\b)?(?:,?\s+(?P<y>\d{{4}})\b)?"
        ),
        _month,
    ),
    (_rx(r"\b(?:in|during|throughout|for)\s+(?P<y>\d{4})\b"), _year),
    (_rx(r"\bthe\s+day\s+before\s+yesterday\b"), _relative(2)),
    (_rx(r"\byesterday\b"), _relative(1)),
    (_rx(r"\btoday\b"), _relative(0)),
    (_rx(rf"\bthe\s+{_UNIT}\s+before\s+last\b"), _relative(2)),
    (_rx(rf"\b(?P<qual>last|previous|this)\s+{_UNIT}\b"), _relative(None)),
    (_rx(rf"\b{_COUNT}\s+{_UNIT}s?\s+ago\b"), _relative(None)),
)


def find_en(text: str, today: dt.date) -> list[Mention]:
    """Every match of every English rule in `text` (overlaps are settled by the caller)."""
    return find_mentions(_RULES, text, today)
