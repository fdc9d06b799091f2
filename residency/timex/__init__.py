"""Rule-based time expressions for questions over dated notes (DESIGN §7): read the period a
question asks about relative to a configurable "today" (never with the LLM), and pick the dated
sections inside it to pin to the top of the context.

The text is NFKC-normalised first (`residency.normalize.normalize_text`), so ２０２４年 works.
The first time expression wins; "A から B (まで)", "A〜B", "from A to B", "between A and B" join
two into one period from the start of A to the end of B. A period still in progress ends today
(今年 asked on 2025-06-15 is 2025-01-01..2025-06-15); one wholly in the future is kept as is
(今年の年末 asked in June). Worked examples, today = 2025-06-15 unless noted:

Our rules (`rules_ja`, `rules_en`; they win where they overlap ja-timex):
- 正月 / お正月 / 元日 / 元旦 / 年始 / 年明け / New Year -> Jan 1-7 of the most recent one started
  by today: 2025-01-01..07; on 2025-01-03 -> 2025-01-01..03. A year wins: 2024年の正月,
  去年の正月, 令和6年の正月 -> 2024-01-01..07. 三が日 -> Jan 1-3; 大晦日 / New Year's Eve -> Dec 31.
- 年末 / 年の瀬 / year-end / end of the year -> Dec 25-31, of the previous year when asked in
  Jan-Jun, else this year's: 2024-12-25..31; on 2025-12-28 -> 2025-12-25..28. 去年の年末 /
  去年末 / end of last year -> last year's; 2024年末 / end of 2024 -> 2024's.
- 年末年始 / year-end and New Year -> Dec 25 - Jan 7, named by its December (same year choice
  as 年末): 2024-12-25..2025-01-07; 2024年の年末年始 -> the same.
- Seasons: 春 3-5月, 夏 6-8月, 秋 9-11月, 冬 12-2月, a winter named by the year its December
  falls in (JMA's convention): 2024年の冬 = 2024-12-01..2025-02-28. 冬 / この冬 / 今冬 / in the
  winter -> the most recent one started by today (in progress counts): 2024-12-01..2025-02-28;
  on 2025-01-03 -> 2024-12-01..2025-01-03; on 2025-12-28 -> 2025-12-01..28. 去年の冬 / 昨冬 ->
  last year's: 2024-12-01..2025-02-28 (asked on 2025-01-03 that is the winter in progress).
  English "last winter" is the latest one already over: on 2025-01-03 -> 2023-12-01..2024-02-29.
  A season kanji counts only before a particle or suffix (冬に, 冬の, 冬季): 秋田 is a place.
- 去年の3月 -> 2024-03-01..31; 去年の3月5日 -> 2024-03-05. 今年度 / 昨年度 -> the fiscal year
  (Apr-Mar) containing today / the one before: 2025-04-01..(today) / 2024-04-01..2025-03-31.
- おととい / 昨夜 -> 2 / 1 days ago.
- English: March / in March -> the most recent March (as N月); March 2024; March 3 / 3 March /
  March 3, 2024; last March (latest one over) / this March (this year's); in 2024; yesterday;
  today; the day before yesterday; last / this week, month, year; N days / weeks / months /
  years ago. Month names must be capitalised; a bare "May" or "fall" needs context.

ja-timex (`ja_timex_rules`, rule "ja-timex"):
- N月 -> the most recent such month started by today; the current month counts and ends today:
  3月 -> 2025-03-01..31; 6月 -> 2025-06-01..15; 12月 -> 2024-12-01..31.
- N月N日 -> the most recent such day not after today: 12月31日 -> 2024-12-31; 2月29日 ->
  2024-02-29 (the last leap day). Explicit years as written: 2024年3月, 2024年3月5日, 2024/3/5,
  2024-03-05, 令和6年3月5日, 2024年 (the year), 2024年度 (2024-04-01..2025-03-31).
- 今日, 昨日 (2025-06-14), 一昨日; 先週 -> the previous Monday-Sunday week (2025-06-02..08;
  2025-06-15 is a Sunday), 今週 -> this week's Monday to today (2025-06-09..15), 先々週; 先月
  (2025-05-01..31), 今月 (2025-06-01..15), 先々月; 去年 / 昨年 (2024), 今年 (2025-01-01..06-15),
  一昨年 (2023); 3日前 -> that day, 2週間前 -> that Monday-Sunday week, 3か月前 -> that month
  (2025-03-01..31), 半年前 -> the month 6 months back.

Not resolved (None): no time expression, "13月", a bare 5日 (often a count, not a date), a
yearless 1/2 (often a fraction), 3日後 / 来月 (the future is not asked about), times of day.
An impossible day with a month (2025年2月29日) reads as that month.

May import: the cross-cutting modules, corpus.
"""

from residency.timex.period import Period
from residency.timex.pinning import select_dated
from residency.timex.resolve import resolve_period

__all__ = ["Period", "resolve_period", "select_dated"]
