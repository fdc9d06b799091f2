"""Time-expression resolution (residency.timex): every rule at several "today"s with
hand-computed periods, odd input, and pinning dated notes of the real harbor-lights corpus."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from residency.corpus.loader import Corpus, load_corpus
from residency.normalize import normalize_text
from residency.timex import Period, ja_timex_rules, resolve_period, select_dated
from residency.tokenizer import ApproxTokenizer

D = dt.date
NEW_YEAR = D(2025, 1, 3)  # a Friday: week 2024-12-30..2025-01-05
MID = D(2025, 6, 15)  # a Sunday: week 2025-06-09..15
YEAR_END = D(2025, 12, 28)  # a Sunday: week 2025-12-22..28
REPO = Path(__file__).resolve().parents[1]
HARBOR = REPO / "residency/data/corpora/harbor-lights/docs"


def case(text: str, today: dt.date, start: dt.date, end: dt.date, rule: str) -> object:
    return pytest.param(text, today, start, end, rule, id=f"{text}@{today}")


RESOLVE = [
    # 正月 family: Jan 1-7 of the most recent one, clipped to today while in progress.
    case("正月に神崎灯台で何があった？", NEW_YEAR, D(2025, 1, 1), D(2025, 1, 3), "shogatsu"),
    case("正月に神崎灯台で何があった？", MID, D(2025, 1, 1), D(2025, 1, 7), "shogatsu"),
    case("お正月", YEAR_END, D(2025, 1, 1), D(2025, 1, 7), "shogatsu"),
    case("元日の出来事", NEW_YEAR, D(2025, 1, 1), D(2025, 1, 3), "shogatsu"),
    case("年始", MID, D(2025, 1, 1), D(2025, 1, 7), "shogatsu"),
    case("年明けの点検", MID, D(2025, 1, 1), D(2025, 1, 7), "shogatsu"),
    case("2024年の正月", NEW_YEAR, D(2024, 1, 1), D(2024, 1, 7), "shogatsu"),
    case("去年の正月", MID, D(2024, 1, 1), D(2024, 1, 7), "shogatsu"),
    case("去年の正月", NEW_YEAR, D(2024, 1, 1), D(2024, 1, 7), "shogatsu"),
    case("令和6年の正月", MID, D(2024, 1, 1), D(2024, 1, 7), "shogatsu"),
    case("三が日", MID, D(2025, 1, 1), D(2025, 1, 3), "sanganichi"),
    case("大晦日", MID, D(2024, 12, 31), D(2024, 12, 31), "omisoka"),
    # 年末: previous year's when asked in Jan-Jun, else this year's.
    case("年末", NEW_YEAR, D(2024, 12, 25), D(2024, 12, 31), "nenmatsu"),
    case("年末", MID, D(2024, 12, 25), D(2024, 12, 31), "nenmatsu"),
    case("年末", D(2025, 7, 1), D(2025, 12, 25), D(2025, 12, 31), "nenmatsu"),  # future: kept
    case("年末", YEAR_END, D(2025, 12, 25), D(2025, 12, 28), "nenmatsu"),
    case("去年の年末", YEAR_END, D(2024, 12, 25), D(2024, 12, 31), "nenmatsu"),
    case("去年末", MID, D(2024, 12, 25), D(2024, 12, 31), "nenmatsu"),
    case("2023年の年末", MID, D(2023, 12, 25), D(2023, 12, 31), "nenmatsu"),
    case("年末年始", NEW_YEAR, D(2024, 12, 25), D(2025, 1, 3), "nenmatsu-nenshi"),
    case("年末年始", MID, D(2024, 12, 25), D(2025, 1, 7), "nenmatsu-nenshi"),
    case("年末年始", YEAR_END, D(2025, 12, 25), D(2025, 12, 28), "nenmatsu-nenshi"),
    case("2024年の年末年始", MID, D(2024, 12, 25), D(2025, 1, 7), "nenmatsu-nenshi"),
    # Years.
    case("去年", NEW_YEAR, D(2024, 1, 1), D(2024, 12, 31), "ja-timex"),
    case("昨年", YEAR_END, D(2024, 1, 1), D(2024, 12, 31), "ja-timex"),
    case("今年", MID, D(2025, 1, 1), D(2025, 6, 15), "ja-timex"),
    case("今年", NEW_YEAR, D(2025, 1, 1), D(2025, 1, 3), "ja-timex"),
    case("一昨年", MID, D(2023, 1, 1), D(2023, 12, 31), "ja-timex"),
    case("2024年", MID, D(2024, 1, 1), D(2024, 12, 31), "ja-timex"),
    case("2024年度", MID, D(2024, 4, 1), D(2025, 3, 31), "ja-timex"),
    case("今年度", MID, D(2025, 4, 1), D(2025, 6, 15), "fiscal-year"),
    case("昨年度", NEW_YEAR, D(2023, 4, 1), D(2024, 3, 31), "fiscal-year"),
    # Seasons: winter Y = Dec Y - Feb Y+1; bare = the most recent one started by today.
    case("冬", NEW_YEAR, D(2024, 12, 1), D(2025, 1, 3), "season"),
    case("冬に何があった", MID, D(2024, 12, 1), D(2025, 2, 28), "season"),
    case("冬", YEAR_END, D(2025, 12, 1), D(2025, 12, 28), "season"),
    case("去年の冬", MID, D(2024, 12, 1), D(2025, 2, 28), "season"),
    case("去年の冬", NEW_YEAR, D(2024, 12, 1), D(2025, 1, 3), "season"),
    case("去年の冬", YEAR_END, D(2024, 12, 1), D(2025, 2, 28), "season"),
    case("この冬", MID, D(2024, 12, 1), D(2025, 2, 28), "season"),
    case("今冬", NEW_YEAR, D(2024, 12, 1), D(2025, 1, 3), "season"),
    case("昨冬", MID, D(2024, 12, 1), D(2025, 2, 28), "season"),
    case("2023年の冬", MID, D(2023, 12, 1), D(2024, 2, 29), "season"),  # leap February
    case("冬季点検", MID, D(2024, 12, 1), D(2025, 2, 28), "season"),
    case("春", MID, D(2025, 3, 1), D(2025, 5, 31), "season"),
    case("夏の台風", MID, D(2025, 6, 1), D(2025, 6, 15), "season"),
    case("夏の台風", NEW_YEAR, D(2024, 6, 1), D(2024, 8, 31), "season"),
    case("秋の点検", YEAR_END, D(2025, 9, 1), D(2025, 11, 30), "season"),
    case("去年の夏", MID, D(2024, 6, 1), D(2024, 8, 31), "season"),
    # N月: the most recent one started by today (the current month counts, ending today).
    case("3月", NEW_YEAR, D(2024, 3, 1), D(2024, 3, 31), "ja-timex"),
    case("3月", MID, D(2025, 3, 1), D(2025, 3, 31), "ja-timex"),
    case("6月", MID, D(2025, 6, 1), D(2025, 6, 15), "ja-timex"),
    case("12月", MID, D(2024, 12, 1), D(2024, 12, 31), "ja-timex"),
    case("12月", YEAR_END, D(2025, 12, 1), D(2025, 12, 28), "ja-timex"),
    case("1月", NEW_YEAR, D(2025, 1, 1), D(2025, 1, 3), "ja-timex"),
    case("三月", MID, D(2025, 3, 1), D(2025, 3, 31), "ja-timex"),
    # N月N日: the most recent such day not after today.
    case("3月5日", NEW_YEAR, D(2024, 3, 5), D(2024, 3, 5), "ja-timex"),
    case("1月3日", NEW_YEAR, D(2025, 1, 3), D(2025, 1, 3), "ja-timex"),
    case("1月4日", NEW_YEAR, D(2024, 1, 4), D(2024, 1, 4), "ja-timex"),
    case("12月31日", MID, D(2024, 12, 31), D(2024, 12, 31), "ja-timex"),
    case("2月29日", MID, D(2024, 2, 29), D(2024, 2, 29), "ja-timex"),
    case("2月29日", D(2024, 2, 28), D(2020, 2, 29), D(2020, 2, 29), "ja-timex"),
    # Explicit years, as written (full-width digits folded by NFKC).
    case("2024年3月", MID, D(2024, 3, 1), D(2024, 3, 31), "ja-timex"),
    case("2024年3月5日", MID, D(2024, 3, 5), D(2024, 3, 5), "ja-timex"),
    case("２０２４年３月５日", MID, D(2024, 3, 5), D(2024, 3, 5), "ja-timex"),
    case("2024/3/5", MID, D(2024, 3, 5), D(2024, 3, 5), "ja-timex"),
    case("2024-03-05", MID, D(2024, 3, 5), D(2024, 3, 5), "ja-timex"),
    case("令和6年3月5日", MID, D(2024, 3, 5), D(2024, 3, 5), "ja-timex"),
    case("去年の3月", MID, D(2024, 3, 1), D(2024, 3, 31), "month"),
    case("去年の3月5日", MID, D(2024, 3, 5), D(2024, 3, 5), "day"),
    case("去年の12月", NEW_YEAR, D(2024, 12, 1), D(2024, 12, 31), "month"),
    # Relative days, weeks, months.
    case("昨日", NEW_YEAR, D(2025, 1, 2), D(2025, 1, 2), "ja-timex"),
    case("昨日", MID, D(2025, 6, 14), D(2025, 6, 14), "ja-timex"),
    case("一昨日", NEW_YEAR, D(2025, 1, 1), D(2025, 1, 1), "ja-timex"),
    case("おととい", NEW_YEAR, D(2025, 1, 1), D(2025, 1, 1), "relative-day"),
    case("今日", YEAR_END, D(2025, 12, 28), D(2025, 12, 28), "ja-timex"),
    case("先週", NEW_YEAR, D(2024, 12, 23), D(2024, 12, 29), "ja-timex"),
    case("先週", MID, D(2025, 6, 2), D(2025, 6, 8), "ja-timex"),
    case("先週", YEAR_END, D(2025, 12, 15), D(2025, 12, 21), "ja-timex"),
    case("今週", NEW_YEAR, D(2024, 12, 30), D(2025, 1, 3), "ja-timex"),
    case("今週", MID, D(2025, 6, 9), D(2025, 6, 15), "ja-timex"),
    case("先月", NEW_YEAR, D(2024, 12, 1), D(2024, 12, 31), "ja-timex"),
    case("先月", MID, D(2025, 5, 1), D(2025, 5, 31), "ja-timex"),
    case("今月", MID, D(2025, 6, 1), D(2025, 6, 15), "ja-timex"),
    case("先々月", NEW_YEAR, D(2024, 11, 1), D(2024, 11, 30), "ja-timex"),
    case("3日前", NEW_YEAR, D(2024, 12, 31), D(2024, 12, 31), "ja-timex"),
    case("三日前", MID, D(2025, 6, 12), D(2025, 6, 12), "ja-timex"),
    case("2週間前", MID, D(2025, 5, 26), D(2025, 6, 1), "ja-timex"),  # 06-01 is a Sunday
    case("3か月前", MID, D(2025, 3, 1), D(2025, 3, 31), "ja-timex"),
    case("3ヶ月前", NEW_YEAR, D(2024, 10, 1), D(2024, 10, 31), "ja-timex"),
    # Ranges: start of A to end of B; a bare B is its first occurrence from A on.
    case("3月から5月まで", MID, D(2025, 3, 1), D(2025, 5, 31), "range"),
    case("3月〜5月", NEW_YEAR, D(2024, 3, 1), D(2024, 5, 31), "range"),
    case("3月から5月まで", D(2025, 4, 10), D(2025, 3, 1), D(2025, 4, 10), "range"),
    case("12月25日から1月7日まで", NEW_YEAR, D(2024, 12, 25), D(2025, 1, 3), "range"),
    case("12月25日から1月7日まで", MID, D(2024, 12, 25), D(2025, 1, 7), "range"),
    case("2024年3月から5月まで", MID, D(2024, 3, 1), D(2024, 5, 31), "range"),
    case("去年の正月から先月まで", MID, D(2024, 1, 1), D(2025, 5, 31), "range"),
    case("年末から正月まで", MID, D(2024, 12, 25), D(2025, 1, 7), "range"),
    case("3月から2024年1月まで", MID, D(2023, 3, 1), D(2024, 1, 31), "range"),  # A moved back
    # English.
    case("What happened at New Year?", MID, D(2025, 1, 1), D(2025, 1, 7), "shogatsu"),
    case("New Year's Day", NEW_YEAR, D(2025, 1, 1), D(2025, 1, 3), "shogatsu"),
    case("New Year 2024", MID, D(2024, 1, 1), D(2024, 1, 7), "shogatsu"),
    case("last New Year", NEW_YEAR, D(2024, 1, 1), D(2024, 1, 7), "shogatsu"),
    case("New Year's Eve", MID, D(2024, 12, 31), D(2024, 12, 31), "omisoka"),
    case("checks at year-end", MID, D(2024, 12, 25), D(2024, 12, 31), "nenmatsu"),
    case("the end of the year", YEAR_END, D(2025, 12, 25), D(2025, 12, 28), "nenmatsu"),
    case("end of last year", YEAR_END, D(2024, 12, 25), D(2024, 12, 31), "nenmatsu"),
    case("end of 2023", MID, D(2023, 12, 25), D(2023, 12, 31), "nenmatsu"),
    case("year-end and New Year holidays", MID, D(2024, 12, 25), D(2025, 1, 7), "nenmatsu-nenshi"),
    case("last year", NEW_YEAR, D(2024, 1, 1), D(2024, 12, 31), "relative-year"),
    case("this year", MID, D(2025, 1, 1), D(2025, 6, 15), "relative-year"),
    case("last winter", MID, D(2024, 12, 1), D(2025, 2, 28), "season"),
    case("last winter", NEW_YEAR, D(2023, 12, 1), D(2024, 2, 29), "season"),  # the one over
    case("last winter", YEAR_END, D(2024, 12, 1), D(2025, 2, 28), "season"),
    case("this winter", NEW_YEAR, D(2024, 12, 1), D(2025, 1, 3), "season"),
    case("in the winter", MID, D(2024, 12, 1), D(2025, 2, 28), "season"),
    case("winter 2023", MID, D(2023, 12, 1), D(2024, 2, 29), "season"),
    case("last fall", MID, D(2024, 9, 1), D(2024, 11, 30), "season"),
    case("in March", NEW_YEAR, D(2024, 3, 1), D(2024, 3, 31), "month"),
    case("in May", MID, D(2025, 5, 1), D(2025, 5, 31), "month"),
    case("last March", D(2025, 3, 15), D(2024, 3, 1), D(2024, 3, 31), "month"),
    case("March 3", MID, D(2025, 3, 3), D(2025, 3, 3), "day"),
    case("3 March", NEW_YEAR, D(2024, 3, 3), D(2024, 3, 3), "day"),
    case("March 3, 2024", MID, D(2024, 3, 3), D(2024, 3, 3), "day"),
    case("the 3rd of March 2024", MID, D(2024, 3, 3), D(2024, 3, 3), "day"),
    case("in 2024", MID, D(2024, 1, 1), D(2024, 12, 31), "year"),
    case("yesterday", NEW_YEAR, D(2025, 1, 2), D(2025, 1, 2), "relative-day"),
    case("the day before yesterday", NEW_YEAR, D(2025, 1, 1), D(2025, 1, 1), "relative-day"),
    case("last week", YEAR_END, D(2025, 12, 15), D(2025, 12, 21), "relative-week"),
    case("this week", NEW_YEAR, D(2024, 12, 30), D(2025, 1, 3), "relative-week"),
    case("last month", NEW_YEAR, D(2024, 12, 1), D(2024, 12, 31), "relative-month"),
    case("3 days ago", NEW_YEAR, D(2024, 12, 31), D(2024, 12, 31), "relative-day"),
    case("two weeks ago", MID, D(2025, 5, 26), D(2025, 6, 1), "relative-week"),
    case("a month ago", MID, D(2025, 5, 1), D(2025, 5, 31), "relative-month"),
    case("from March to May", MID, D(2025, 3, 1), D(2025, 5, 31), "range"),
    case("between March and May", NEW_YEAR, D(2024, 3, 1), D(2024, 5, 31), "range"),
    # Odd input: the nearest valid reading.
    case("2025年2月29日", MID, D(2025, 2, 1), D(2025, 2, 28), "ja-timex"),  # no such day
    case("2月30日", MID, D(2025, 2, 1), D(2025, 2, 28), "ja-timex"),
    case("去年の13月", MID, D(2024, 1, 1), D(2024, 12, 31), "ja-timex"),  # 去年 survives
]


@pytest.mark.parametrize(("text", "today", "start", "end", "rule"), RESOLVE)
def test_resolve_period(text: str, today: dt.date, start: dt.date, end: dt.date, rule: str) -> None:
    period = resolve_period(text, today)
    assert period is not None
    assert (period.start, period.end, period.rule) == (start, end, rule)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "灯台の点検手順は？",
        "13月",
        "13月に何があった？",
        "1/2の確率で",  # a yearless fraction, not January 2
        "5日に",  # a bare day of month: too often a count
        "3日後",  # the future is not asked about
        "来月",
        "秋田で何があった？",  # a place, not autumn
        "May I ask about the lamp?",
        "Did the lamp fall?",
        "9時05分に何があった",  # a time of day only
        "9999年の冬",  # would end past date.max
        "99999999999日前",
    ],
)
def test_resolve_period_none(text: str) -> None:
    assert resolve_period(text, MID) is None


@pytest.mark.parametrize(
    ("text", "expression"),
    [
        ("正月に神崎灯台で何があった？", "正月"),
        ("去年の冬に何があった？", "去年の冬"),
        ("２０２５年の正月は？", "2025年の正月"),  # NFKC-normalised
        ("3月から5月までの点検", "3月から5月まで"),
        ("What happened from March to May?", "March to May"),
    ],
)
def test_expression_is_the_matched_text(text: str, expression: str) -> None:
    period = resolve_period(text, MID)
    assert period is not None
    assert period.expression == expression


def test_first_expression_wins() -> None:
    period = resolve_period("去年の正月と今年の正月の違いは？", MID)
    assert period is not None
    assert (period.start, period.end) == (D(2024, 1, 1), D(2024, 1, 7))
    assert period.expression == "去年の正月"


def test_describe_states_the_period() -> None:
    span = Period(D(2025, 1, 1), D(2025, 1, 7), "正月", "shogatsu")
    day = Period(D(2025, 1, 2), D(2025, 1, 2), "昨日", "ja-timex")
    head = "質問の対象期間 / Period asked about: "
    assert span.describe() == head + "2025-01-01 〜 2025-01-07（正月）"
    assert day.describe() == head + "2025-01-02（昨日）"


def test_contains_includes_both_ends() -> None:
    period = Period(D(2025, 1, 1), D(2025, 1, 7), "正月", "shogatsu")
    assert [period.contains(d) for d in (D(2024, 12, 31), D(2025, 1, 1), D(2025, 1, 7))] == [
        False,
        True,
        True,
    ]
    assert not period.contains(D(2025, 1, 8))


def test_period_rejects_end_before_start() -> None:
    with pytest.raises(ValueError, match="before it starts"):
        Period(D(2025, 1, 7), D(2025, 1, 1), "x", "x")


def test_resolve_period_is_thread_safe() -> None:
    # ja-timex's parser keeps per-parse state on shared objects; parses are serialised.
    texts = ["3日前", "2024年3月5日", "先週", "去年の冬", "12月25日から1月7日まで", "3か月前"] * 20
    expected = [resolve_period(t, MID) for t in texts]
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(lambda t: resolve_period(t, MID), texts)) == expected


def test_ja_timex_is_imported_lazily() -> None:
    code = "import sys, residency.timex; sys.exit('ja_timex' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False).returncode == 0


# --- select_dated on the real sample corpus -------------------------------------------------

KANZAKI = "note-2025-01-01-kanzaki-main-lamp"
UNOSHIMA = "note-2025-01-03-unoshima-low-voltage"
KOHAMA = "note-2025-01-07-kohama-outage"


@pytest.fixture(scope="module")
def harbor() -> Corpus:
    return load_corpus(HARBOR, ApproxTokenizer())


def _ids(text: str, today: dt.date, corpus: Corpus, ranked: list[str], limit: int = 5) -> list[str]:
    period = resolve_period(text, today)
    assert period is not None
    return [s.id for s in select_dated(corpus.sections, period, ranked, limit)]


def test_select_dated_shogatsu_nearest_end_first(harbor: Corpus) -> None:
    assert _ids("正月に何があった？", MID, harbor, []) == [KOHAMA, UNOSHIMA, KANZAKI]


def test_select_dated_ranked_first(harbor: Corpus) -> None:
    # Ranked ids out of the period (03-04) or undated (the manual) are not pinned.
    ranked = ["manual/operations#lamp-daily-check", "note-2025-03-04-kanzaki-fog-false", KANZAKI]
    assert _ids("正月に何があった？", MID, harbor, ranked) == [KANZAKI, KOHAMA, UNOSHIMA]


def test_select_dated_limit(harbor: Corpus) -> None:
    # Winter 2024 holds 8 notes (01-01 .. 02-26); the ranked one first, then latest first.
    ranked = [UNOSHIMA, UNOSHIMA]  # ranked twice, pinned once
    assert _ids("去年の冬", MID, harbor, ranked) == [
        UNOSHIMA,
        "note-2025-02-26-leading-trees",
        "note-2025-02-20-mikagese-patrol",
        "note-2025-02-14-kita-breakwater-patrol",
        "note-2025-02-06-mikagese-postponed",
    ]
    assert len(_ids("去年の冬", MID, harbor, [], limit=8)) == 8
    assert _ids("去年の冬", MID, harbor, [KANZAKI], limit=0) == []


def test_select_dated_clipped_to_today(harbor: Corpus) -> None:
    # 年末 on 2025-12-28 ends today: the 12-31 note has not happened yet.
    assert _ids("年末", YEAR_END, harbor, []) == ["note-2025-12-26-year-end-check"]
    assert _ids("年末", D(2026, 1, 3), harbor, []) == [
        "note-2025-12-31-mikagese-anomaly",
        "note-2025-12-26-year-end-check",
    ]


def test_select_dated_only_dated_sections(harbor: Corpus) -> None:
    dated = [s for s in harbor.sections if s.date is not None]
    picked = _ids("2025年", D(2026, 1, 3), harbor, [], limit=1000)
    assert len(dated) == 43 < len(harbor.sections)  # the manual, FAQ and report are undated
    assert sorted(picked) == sorted(s.id for s in dated)


def test_select_dated_ties_in_corpus_order(tmp_path: Path) -> None:
    notes = tmp_path / "notes.jsonl"
    notes.write_text(
        '{"id": "b", "date": "2025-01-02", "text": "B"}\n'
        '{"id": "a", "date": "2025-01-02", "text": "A"}\n'
        '{"id": "c", "date": "2025-01-01", "text": "C"}\n',
        encoding="utf-8",
    )
    corpus = load_corpus(tmp_path, ApproxTokenizer())
    assert _ids("正月", MID, corpus, []) == ["b", "a", "c"]
    assert _ids("正月", MID, corpus, ["c"]) == ["c", "b", "a"]


# --- the ja-timex pre-check -------------------------------------------------------------------

JSQUAD = REPO.parent / "shared/data/jsquad/valid-v1.3.json"


def _texts_we_have() -> list[str]:
    """Every time expression above, every question and corpus line of both sample corpora, and
    every fourth of JSQuAD's questions when the data is beside the repo (~1,100: each is parsed
    twice, with and without the pre-check, for two dates)."""
    texts = [p.values[0] for p in RESOLVE] + ["おととしの冬", "一昨年", "二〇二四/三/五", "3/5"]
    for corpus in ("harbor-lights", "harbor-lights-en"):
        root = REPO / "residency" / "data" / "corpora" / corpus
        for name in ("qa.jsonl", "queries.jsonl"):
            for line in (root / name).read_text("utf-8").splitlines():
                record = json.loads(line)
                texts.append(record.get("question") or record.get("query") or "")
        for doc in sorted((root / "docs").rglob("*.md")):
            texts += doc.read_text("utf-8").splitlines()
    if JSQUAD.exists():
        data = json.loads(JSQUAD.read_text("utf-8"))["data"]
        asked = [q["question"] for a in data for p in a["paragraphs"] for q in p["qas"]]
        texts += asked[::4]
    return [normalize_text(t) for t in texts if t.strip()]


def test_the_ja_timex_pre_check_skips_only_texts_without_a_date() -> None:
    texts = _texts_we_have()
    skipped = found = 0
    for text in texts:
        for today in (NEW_YEAR, MID):
            full = [(m.start, m.end, m.resolve(today)) for m in ja_timex_rules._parse(text, today)]
            gated = ja_timex_rules.find_ja_timex(text, today)
            assert [(m.start, m.end, m.resolve(today)) for m in gated] == full, text
            found += bool(full)
        skipped += ja_timex_rules._MAY_HOLD_DATE.search(text) is None
    assert found > 100  # the comparison covers many real mentions...
    assert skipped > len(texts) // 4  # ...and the pre-check does skip a good share of texts


def test_ja_timex_patterns_are_compiled_once() -> None:
    """numpy.f2py shrinks `re`'s module cache to 50 for the whole process (scipy imports it);
    ja-timex's patterns, passed to `re` as strings, were then recompiled on every parse
    (~100 ms a parse). The parser residency builds holds them compiled."""
    import re

    parser = ja_timex_rules._parser()
    patterns = [p.re_pattern for group in parser.all_patterns.values() for p in group]
    assert len(patterns) > 50  # more than such a cache holds
    assert all(isinstance(p, re.Pattern) for p in patterns)
