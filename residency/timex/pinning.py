"""Which dated sections to pin to the top of the context for a period asked about."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from residency.corpus.model import Section
from residency.timex.period import Period


def select_dated(
    sections: Sequence[Section], period: Period, ranked_ids: Sequence[str], limit: int = 5
) -> list[Section]:
    """Sections dated inside `period`, at most `limit`: retrieved ones first (in `ranked_ids`
    order), then the rest nearest the period's end first (ties: corpus order)."""
    dated: dict[str, tuple[dt.date, Section]] = {
        s.id: (s.date, s) for s in sections if s.date is not None and period.contains(s.date)
    }
    picked: list[Section] = []
    for sid in ranked_ids:
        hit = dated.pop(sid, None)  # pop: an id ranked twice is pinned once
        if hit is not None:
            picked.append(hit[1])
    # Every remaining date is <= period.end, so "nearest the end" is "latest first".
    rest = sorted(dated.values(), key=lambda pair: (-pair[0].toordinal(), pair[1].order))
    picked.extend(section for _, section in rest)
    return picked[: max(limit, 0)]
