"""The resolved period a question asks about, and the line the prompt states for it."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from residency.prompt_language import JA, PromptLanguage


@dataclass(frozen=True, slots=True)
class Period:
    """Inclusive [start, end], the expression it was read from and the rule that read it."""

    start: dt.date
    end: dt.date
    expression: str  # as matched in the NFKC-normalised question: "去年の冬", "2025年の正月"
    rule: str  # "shogatsu", "nenmatsu", "season", "month", "ja-timex", "range", ...

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"period ends ({self.end}) before it starts ({self.start})")

    def contains(self, day: dt.date) -> bool:
        """Whether `day` falls inside the period (both ends included)."""
        return self.start <= day <= self.end

    def describe(self, language: PromptLanguage = JA) -> str:
        """The prompt line: '質問の対象期間 / Period asked about: 2025-01-01 〜 2025-01-07（正月）',
        in English 'Period asked about: 2025-01-01 to 2025-01-07 (new year)' (a single day is
        written once)."""
        sep = language.range_separator
        dates = str(self.start) if self.start == self.end else f"{self.start}{sep}{self.end}"
        expression = language.expression_format.format(self.expression)
        return f"{language.period_label}: {dates}{expression}"
