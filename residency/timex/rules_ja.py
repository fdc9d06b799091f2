"""Our own rules for Japanese colloquial periods ja-timex leaves alone or reads too narrowly:
正月 / 年末 / 年末年始 / seasons / 年度, each optionally anchored to a year (2024年の, 去年の,
令和6年の), and a relative year with a month or day (去年の3月). They run on NFKC text."""

from __future__ import annotations

import datetime as dt
import re
from functools import partial

from residency.timex import occurrences as occ
from residency.timex.mention import Build, Mention, Rule, find_mentions, fixed, recent

_REL_YEARS = {"今年": 0, "本年": 0, "去年": 1, "昨年": 1, "一昨年": 2, "おととし": 2}
_ERA_BASE = {"令和": 2018, "平成": 1988}  # 令和元年 = 2019, 平成元年 = 1989
_REL = "(?P<rel>一昨年|おととし|去年|昨年|今年|本年)"
_ANCHOR = rf"(?:(?P<abs>\d{{4}})年|(?P<era>令和|平成)(?P<era_y>\d{{1,2}}|元)年|{_REL})"
# A season kanji is a season only before a particle or a season suffix: 秋田, 春日 are places.
_SEASON_FOLLOW = r"(?=[にのはもでをがと頃季期場先、。,.?!~〜\s-]|ごろ|から|まで|$)"
_SEASONS = {"春": "spring", "夏": "summer", "秋": "autumn", "冬": "winter"}
_FISCAL = {"今年度": 0, "本年度": 0, "昨年度": 1, "前年度": 1, "一昨年度": 2}
_DAYS_BACK = {"おととい": 2, "昨夜": 1, "昨晩": 1, "昨夕": 1}


def _anchor_year(m: re.Match[str], today: dt.date) -> int | None:
    """The year an anchor names: 2024年 -> 2024, 令和6年 -> 2024, 去年 -> today's year - 1."""
    groups = m.groupdict()
    if groups.get("abs"):
        return int(groups["abs"])
    if groups.get("era"):
        n = 1 if groups["era_y"] == "元" else int(groups["era_y"])
        return _ERA_BASE[groups["era"]] + n
    if groups.get("rel"):
        return today.year - _REL_YEARS[groups["rel"]]
    return None


def _anchored(target: str, suffix: str = "") -> re.Pattern[str]:
    """`target` with an optional year anchor (2024年の正月, 去年正月); `suffix` is the short
    form written straight after the anchor (去年末 = 去年の年末)."""
    short = f"|{suffix}" if suffix else ""
    return re.compile(rf"{_ANCHOR}(?:の?(?:{target}){short})|(?:{target})")


def _named(
    bounds: tuple[tuple[int, int], tuple[int, int]], rule: str, bare_year_end: bool
) -> Build:
    """正月-like fixed periods: anchored -> that year's; bare -> the most recent one, except
    年末 / 年末年始, which follow DESIGN §7 (the previous year's when asked in Jan-Jun)."""
    yearly = partial(occ.fixed_span, start=bounds[0], end=bounds[1])

    def build(m: re.Match[str], today: dt.date) -> Mention:
        year = _anchor_year(m, today)
        if year is not None:
            return Mention(m.start(), m.end(), rule, fixed(yearly(year)))
        if bare_year_end:

            def by_month(ref: dt.date) -> occ.Span | None:
                return yearly(occ.year_end_year(ref))

            return Mention(m.start(), m.end(), rule, by_month, yearless=True)
        return Mention(m.start(), m.end(), rule, recent(yearly), yearless=True)

    return build


def _season(m: re.Match[str], today: dt.date) -> Mention:
    """去年の冬 / 2024年冬 -> that year's season; 昨冬 -> last year's; 冬 / この冬 / 今冬 -> the
    most recent one started by today (the one in progress counts)."""
    yearly = partial(occ.season_span, _SEASONS[m["season"]])
    year = _anchor_year(m, today)
    if m["prev"]:
        year = today.year - 1
    if year is not None:
        return Mention(m.start(), m.end(), "season", fixed(yearly(year)))
    return Mention(m.start(), m.end(), "season", recent(yearly), yearless=True)


def _rel_month(m: re.Match[str], today: dt.date) -> Mention:
    """去年の3月 -> March of last year; 去年の3月5日 -> that day (a day the month lacks, such as
    2月30日, falls back to the month: the nearest valid reading)."""
    year = today.year - _REL_YEARS[m["rel"]]
    month = occ.month_span(year, int(m["m"]))
    if m["d"]:
        day = occ.day_span(year, int(m["m"]), int(m["d"]))
        if day is not None:
            return Mention(m.start(), m.end(), "day", fixed(day))
    return Mention(m.start(), m.end(), "month", fixed(month))


def _fiscal(m: re.Match[str], today: dt.date) -> Mention:
    """今年度 / 昨年度: the Japanese fiscal year (Apr-Mar) containing today, or the one before."""
    year = occ.fiscal_year_of(today) - _FISCAL[m[0]]
    return Mention(m.start(), m.end(), "fiscal-year", fixed(occ.fiscal_year_span(year)))


def _days_back(m: re.Match[str], today: dt.date) -> Mention:
    """おととい / 昨夜: colloquial days ja-timex does not know."""
    span = occ.relative_span("day", _DAYS_BACK[m[0]], today)
    return Mention(m.start(), m.end(), "relative-day", fixed(span))


_RULES: tuple[Rule, ...] = (
    (
        _anchored("年末年始", suffix="末年始"),
        _named(occ.YEAR_END_NEW_YEAR, "nenmatsu-nenshi", bare_year_end=True),
    ),
    (
        _anchored("年末|年の瀬", suffix="末"),
        _named(occ.YEAR_END, "nenmatsu", bare_year_end=True),
    ),
    (
        _anchored("三が日|三箇日|三ヶ日"),
        _named(occ.SANGANICHI, "sanganichi", bare_year_end=False),
    ),
    (
        _anchored("お正月|正月|元日|元旦|年始|年明け"),
        _named(occ.SHOGATSU, "shogatsu", bare_year_end=False),
    ),
    (
        _anchored("大晦日|大みそか"),
        _named(occ.OMISOKA, "omisoka", bare_year_end=False),
    ),
    (
        re.compile(
            rf"(?:{_ANCHOR}の?|(?P<cur>この|今)|(?P<prev>昨))?(?P<season>[春夏秋冬]){_SEASON_FOLLOW}"
        ),
        _season,
    ),
    (re.compile(rf"{_REL}の?(?P<m>\d{{1,2}})月(?:(?P<d>\d{{1,2}})日)?"), _rel_month),
    (re.compile("|".join(_FISCAL)), _fiscal),
    (re.compile("|".join(_DAYS_BACK)), _days_back),
)


def find_ja(text: str, today: dt.date) -> list[Mention]:
    """Every match of every Japanese rule in `text` (overlaps are settled by the caller)."""
    return find_mentions(_RULES, text, today)
