"""The router's agent loops: residency from vLLM's KV events, re-planning from the query log,
and the recall canary (each field is a `residency serve` flag)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from residency.flags import Flag

AGENT = "Agent (KV events, re-planning, recall canary)"
# 'R@10=0.80' (also R@1, R@3, R@5, MRR@10): the same spelling as `eval retrieval --min-recall`.
MIN_RECALL_PATTERN = re.compile(r"(?i)\s*(R@(?:1|3|5|10)|MRR@10)\s*=\s*([01](?:\.\d+)?)\s*")


class AgentSettings(BaseModel):
    """What the router watches and corrects on its own."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    kv_events: Annotated[Literal["auto", "off"], Flag("--kv-events", panel=AGENT)] = Field(
        default="auto",
        description="auto: where an upstream publishes KV events (vLLM --kv-events-config, "
        "listed at its /kv_event_sources), know each prefix's resident blocks from them and "
        "re-warm a prefix when its blocks are evicted; elsewhere, and with off, keep-warm "
        "counts tokens.",
    )
    rewarm_interval_s: Annotated[float, Flag("--rewarm-interval", panel=AGENT)] = Field(
        default=2.0,
        ge=0,
        le=3600,
        description="Seconds between two re-warms of one prefix on one upstream, whatever "
        "the reason (eviction, cleared cache, restarted engine).",
    )
    rewarm_wait_s: Annotated[float, Flag("--rewarm-wait", panel=AGENT)] = Field(
        default=5.0,
        ge=0,
        le=3600,
        description="Seconds a request waits at most for a re-warm of its prefix (then it goes "
        "and prefills what is missing itself).",
    )
    kv_event_max_bytes: Annotated[int, Flag("--kv-event-max-bytes", panel=AGENT)] = Field(
        default=4 * 1024 * 1024,
        ge=64 * 1024,
        le=1024 * 1024 * 1024,
        description="Largest KV-event message read from an upstream's publisher (a larger one "
        "is dropped); a 32K-token prefill's batch is about 170 KB.",
    )
    replan_every_s: Annotated[float | None, Flag("--replan-every", panel=AGENT)] = Field(
        default=None,
        gt=0,
        le=30 * 86400,
        description="Seconds between re-plans from the query log's last --replan-window "
        "questions; the new plan is warmed and swapped in (as SIGHUP does) only when it "
        "covers more of them by --replan-margin (default: never re-plan).",
    )
    replan_window: Annotated[int, Flag("--replan-window", panel=AGENT)] = Field(
        default=500,
        ge=10,
        le=1_000_000,
        description="Query-log questions (the latest) a re-plan reads and is judged on.",
    )
    replan_source_share: Annotated[float, Flag("--replan-source-share", panel=AGENT)] = Field(
        default=0.1,
        gt=0,
        le=1,
        description="Share of the --replan-window one source (API key, else client address) "
        "may fill, each of its questions once: one client cannot steer the plan (1: no cap, "
        "for a router every client reaches through one key or proxy).",
    )
    replan_margin: Annotated[float, Flag("--replan-margin", panel=AGENT)] = Field(
        default=0.02,
        ge=0,
        le=1,
        description="Coverage gain (share of the window's questions whose top chunk is "
        "resident) a new plan needs over the current one to be swapped in, on the window and "
        "on its held-back quarter; on --canary's questions it may lose no more than this.",
    )
    canary: Annotated[Path | None, Flag("--canary", panel=AGENT)] = Field(
        default=None,
        description="Labelled questions (jsonl: query, relevant_ids) the router runs through "
        "its live retriever on a schedule and on every plan or index change, exporting "
        "recall@k and MRR@10 (default: no canary).",
    )
    canary_every_s: Annotated[float, Flag("--canary-every", panel=AGENT)] = Field(
        default=300.0, gt=0, le=86400, description="Seconds between two canary runs."
    )
    min_recall: Annotated[str, Flag("--min-recall", panel=AGENT)] = Field(
        default="R@10=0.80",
        max_length=32,
        description="The canary's floor, METRIC=VALUE (R@1, R@3, R@5, R@10, MRR@10): below it "
        "the router logs a warning and residency_recall_ok reads 0.",
    )

    @field_validator("min_recall")
    @classmethod
    def _floor(cls, text: str) -> str:
        if MIN_RECALL_PATTERN.fullmatch(text) is None or not 0 <= floor_of(text)[1] <= 1:
            raise ValueError(
                f"--min-recall {text!r}: expected METRIC=VALUE with METRIC one of R@1, R@3, "
                "R@5, R@10, MRR@10 and VALUE in [0, 1], e.g. R@10=0.80"
            )
        return text


def floor_of(text: str) -> tuple[str, float]:
    """('recall_at_10', 0.8) for 'R@10=0.80', ('mrr_at_10', 0.5) for 'MRR@10=0.5'."""
    match = MIN_RECALL_PATTERN.fullmatch(text)
    assert match is not None
    name, value = match.group(1).upper(), float(match.group(2))
    field = "mrr_at_10" if name == "MRR@10" else f"recall_at_{name.split('@')[1]}"
    return field, value
