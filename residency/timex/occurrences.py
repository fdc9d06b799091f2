"""Calendar arithmetic for named periods: where a month, season, 正月 or week starts and ends,
and which occurrence of a yearly period a bare mention ("3月", "冬") means relative to a day."""

from __future__ import annotations

import calendar
import datetime as dt
from collections.abc import Callable

Span = tuple[dt.date, dt.date]  # (start, end), both inclusive
Yearly = Callable[[int], Span | None]  # year -> that year's occurrence (None: none that year)

# A bare February 29 needs up to 8 years of look-back (1896 -> 1904 skips 1900); every other
# yearly period is found within 2.
_LOOKBACK_YEARS = 8

SEASON_MONTHS = {"spring": 3, "summer": 6, "autumn": 9, "winter": 12}  # first month; 3 long


def month_end(year: int, month: int) -> dt.date:
    """The last day of a month: month_end(2024, 2) == 2024-02-29."""
    return dt.date(year, month, calendar.monthrange(year, month)[1])


def shift_month(year: int, month: int, by: int) -> tuple[int, int]:
    """(year, month) `by` months later; shift_month(2025, 1, -2) == (2024, 11)."""
    n = year * 12 + (month - 1) + by
    return n // 12, n % 12 + 1


def month_span(year: int, month: int) -> Span | None:
    """1st to last day of the month; None for a month outside 1..12 ("13月")."""
    if not 1 <= month <= 12 or not dt.MINYEAR < year < dt.MAXYEAR:
        return None
    return dt.date(year, month, 1), month_end(year, month)


def day_span(year: int, month: int, day: int) -> Span | None:
    """The single day; None when it does not exist (2025-02-29)."""
    try:
        d = dt.date(year, month, day)
    except ValueError:
        return None
    return d, d


def year_span(year: int) -> Span | None:
    """Jan 1 to Dec 31."""
    if not dt.MINYEAR < year < dt.MAXYEAR:
        return None
    return dt.date(year, 1, 1), dt.date(year, 12, 31)


def fiscal_year_span(year: int) -> Span | None:
    """Japanese fiscal year (年度) `year`: Apr 1 `year` to Mar 31 the next year."""
    if not dt.MINYEAR < year < dt.MAXYEAR - 1:
        return None
    return dt.date(year, 4, 1), dt.date(year + 1, 3, 31)


def fiscal_year_of(day: dt.date) -> int:
    """The 年度 a day falls in: 2025-01-03 is in 2024年度 (Apr 2024 - Mar 2025)."""
    return day.year if day.month >= 4 else day.year - 1


def season_span(season: str, year: int) -> Span | None:
    """Three months from the season's first month of `year`; winter 2024 = 2024-12-01 to
    2025-02-28 (a winter is named by the year its December falls in, as JMA's 冬 = 12-2月)."""
    first = month_span(year, SEASON_MONTHS[season])
    if first is None or year + 1 >= dt.MAXYEAR:
        return None
    last_y, last_m = shift_month(year, SEASON_MONTHS[season], 2)
    return first[0], month_end(last_y, last_m)


def fixed_span(year: int, start: tuple[int, int], end: tuple[int, int]) -> Span | None:
    """A fixed (month, day) range of `year`; an end before the start falls in the next year:
    fixed_span(2024, (12, 25), (1, 7)) == (2024-12-25, 2025-01-07), 年末年始."""
    try:
        first = dt.date(year, *start)
        last = dt.date(year, *end)
        if last < first:
            last = dt.date(year + 1, *end)
    except ValueError:
        return None
    return first, last


SHOGATSU = ((1, 1), (1, 7))  # 正月 / 元日 / 年始 / 年明け / New Year (DESIGN §7)
SANGANICHI = ((1, 1), (1, 3))  # 三が日
YEAR_END = ((12, 25), (12, 31))  # 年末 (DESIGN §7)
YEAR_END_NEW_YEAR = ((12, 25), (1, 7))  # 年末年始, named by the year of its December
OMISOKA = ((12, 31), (12, 31))  # 大晦日 / New Year's Eve


def week_span(day: dt.date) -> Span:
    """The Monday-Sunday week containing `day`."""
    monday = day - dt.timedelta(days=day.weekday())
    return monday, monday + dt.timedelta(days=6)


def most_recent(yearly: Yearly, ref: dt.date) -> Span | None:
    """The latest occurrence that has started by `ref` (the one in progress counts).

    Worked example: 冬 on 2025-01-03 -> winter 2024 (2024-12-01..2025-02-28, in progress);
    on 2025-06-15 -> the same winter; on 2025-12-28 -> winter 2025 (started 12-01).
    """
    for year in range(ref.year, ref.year - _LOOKBACK_YEARS - 1, -1):
        span = yearly(year)
        if span is not None and span[0] <= ref:
            return span
    return None


def last_completed(yearly: Yearly, ref: dt.date) -> Span | None:
    """The latest occurrence that ended before `ref` (English "last winter")."""
    for year in range(ref.year, ref.year - _LOOKBACK_YEARS - 1, -1):
        span = yearly(year)
        if span is not None and span[1] < ref:
            return span
    return None


def year_end_year(ref: dt.date) -> int:
    """Which year's 年末 a bare 年末 means (DESIGN §7): the previous one when asked in Jan-Jun,
    this year's from July on."""
    return ref.year - 1 if ref.month <= 6 else ref.year


def relative_span(unit: str, n: int, today: dt.date) -> Span | None:
    """`n` units before today as a whole unit: day -> that day, week -> its Monday-Sunday week,
    month / year -> that calendar month / year. 3 weeks before 2025-06-15 (a Sunday) -> the week
    of 2025-05-25 = 2025-05-19..2025-05-25."""
    if n < 0:
        return None
    try:
        if unit == "day":
            d = today - dt.timedelta(days=n)
            return d, d
        if unit == "week":
            return week_span(today - dt.timedelta(weeks=n))
    except OverflowError:
        return None
    if unit == "month":
        return month_span(*shift_month(today.year, today.month, -n))
    if unit == "year":
        return year_span(today.year - n)
    return None
