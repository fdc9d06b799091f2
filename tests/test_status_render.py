"""`residency status`'s table at 80 columns: one row per upstream x prefix with every fixed
column whole (no wrapped ids or states), and one line per upstream when nothing is planned."""

from __future__ import annotations

import io
import time

from rich.console import Console

from residency.cli.status import render
from residency.status.model import (
    AdmittedRequest,
    EvictionRecord,
    PrefixStatus,
    ResidencyStatus,
    UpstreamStatus,
)


def drawn(picture: ResidencyStatus, width: int = 80) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(render(picture, "12:00:00"))
    return out.getvalue().splitlines()


def picture(prefixes: int) -> ResidencyStatus:
    admitted = AdmittedRequest(
        before_s=0.2, prefix="p0", route="long_tail", prompt_tokens=5000, uncached_tokens=4870
    )
    eviction = EvictionRecord(
        at_unix_s=time.time() - 3,
        engine_at_unix_s=time.time() - 3.01,
        upstream="1",
        prefix="p1",
        blocks_lost=3,
        resident_blocks=34,
        total_blocks=37,
        kv_cache_usage_perc=0.91,
        admitted=[admitted],
    )
    rows = [
        PrefixStatus(
            upstream=str(u),
            prefix=f"p{i}",
            mode="events",
            resident_blocks=34 if i else 37,
            total_blocks=37,
            state="partial" if i else "resident",
            hits=97,
            misses=3,
            rewarms=12,
            last_eviction=eviction if i else None,
        )
        for u in range(2)
        for i in range(prefixes)
    ]
    ups = [
        UpstreamStatus(upstream=str(u), healthy=True, mode="events", evictions=4) for u in (0, 1)
    ]
    return ResidencyStatus(
        plan_sha256="ab" * 32,
        recent_requests=100,
        ready=True,
        missing=[],
        upstreams=ups,
        prefixes=rows,
    )


def test_the_table_fits_80_columns_with_every_row_whole() -> None:
    lines = drawn(picture(12))
    assert max(len(line) for line in lines) <= 80
    for u in range(2):
        for i in range(12):
            row = [x for x in lines if f" p{i} " in x and x.strip().startswith(str(u))]
            assert len(row) == 1, (u, i, lines)
            assert ("34/37" if i else "37/37") in row[0]
            assert ("partial" if i else "resident") in row[0]
            assert "97/3" in row[0]
    assert any("past router" in x or "1req 4870tok" in x for x in lines)


def test_one_line_per_upstream_when_nothing_is_planned() -> None:
    lines = drawn(picture(0))
    assert "nothing planned" in lines[0]
    body = [x for x in lines if x.strip()[:1] in ("0", "1")]
    assert len(body) == 2
    assert all("healthy" in x for x in body)
