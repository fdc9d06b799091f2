"""The router's dated route in the coverage evaluation: the sections a question's time
expression pins whole (`residency.context.builder.pinned_dated`, the router's own choice), what
they show and what they cost."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from residency.context.builder import pinned_dated
from residency.index import Index
from residency.planning.prefix import render_passage
from residency.retrieval import FusedHit
from residency.timex import resolve_period
from residency.tokenizer import ModelTokenizer


@dataclass(frozen=True, slots=True)
class DatedPinning:
    """The dated route against one `today`, at most `max_dated` sections per question."""

    index: Index
    today: dt.date
    max_dated: int
    section_tokens: Mapping[str, int]  # each dated section rendered whole, plus its separator

    def sections(
        self, query: str, hits: Sequence[FusedHit], prefix: Collection[str]
    ) -> tuple[str, ...]:
        """Ids of the sections pinned for one question routed to a prefix holding the chunks
        `prefix`; none without a time expression."""
        period = resolve_period(query, self.today)
        return pinned_dated(self.index, period, hits, prefix, self.max_dated)

    def tokens(self, section_ids: Collection[str]) -> int:
        """Prompt tokens of pinned sections (each rendered whole, plus its separator)."""
        return sum(self.section_tokens[s] for s in section_ids)


def dated_pinning(
    index: Index, encoder: ModelTokenizer, today: dt.date | None, max_dated: int
) -> DatedPinning | None:
    """The dated route for `index` (None when no section has a date or `max_dated` is 0);
    `today` None: the date today, as the router."""
    dated = [s for s in index.sections if s.date is not None]
    if not dated or max_dated <= 0:
        return None
    tokens = {s.id: encoder.count(render_passage(s, s.text)) + 1 for s in dated}
    return DatedPinning(index, today or dt.date.today(), max_dated, tokens)
