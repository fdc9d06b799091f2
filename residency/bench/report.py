"""The `residency bench` report: per-length TTFT spreads, warm/cold ratios, cached tokens."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from residency.atomic import write_bytes_atomic
from residency.machine import MachineInfo
from residency.stats import TimingStats
from residency.vllm_client import TTFT_METHOD

CachedSource = Literal["usage", "metrics"]


class LengthResult(BaseModel):
    """Cold and warm TTFT of one prompt length (or of the plan's shared prefix)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    label: str = Field(min_length=1, max_length=64, description="Requested length, or 'plan'.")
    prompt_tokens: int = Field(ge=1, le=10_000_000, description="Tokens of every send.")
    expected_cached_tokens: int = Field(
        ge=0, le=10_000_000, description="floor((prompt - 1) / block) * block: a full warm hit."
    )
    cold: TimingStats = Field(description="Sends with a never-seen salt at the start.")
    warm: TimingStats = Field(description="Timed repeats after admission.")
    warm_over_cold: float | None = Field(
        ge=0, le=1_000, description="Median warm / median cold TTFT."
    )
    cold_ttft_s: tuple[float, ...] = Field(max_length=10_000, description="Every cold TTFT.")
    warm_ttft_s: tuple[float, ...] = Field(max_length=10_000, description="Every warm TTFT.")
    cold_cached_tokens: tuple[int, ...] = Field(
        max_length=10_000, description="Cached tokens of each cold send (must stay < one block)."
    )
    warm_cached_tokens: tuple[int, ...] = Field(
        max_length=10_000, description="Cached tokens of each timed warm send."
    )
    cold_verified: bool = Field(description="Every cold send cached less than one block.")
    warm_resident: bool = Field(description="Every timed warm send hit the expected tokens.")
    admit_sends: int = Field(
        ge=0, le=1_000, description="Untimed sends of the warm prompt until one hit."
    )


class CoveragePoint(BaseModel):
    """Measured coverage of one strategy at one resident budget."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    strategy: str = Field(min_length=1, max_length=64, description="planner, a baseline, rag-topK.")
    budget_tokens: int = Field(ge=1, le=10_000_000, description="Resident budget planned for.")
    prefix_tokens: int = Field(ge=0, le=10_000_000, description="Tokens of the prefix it chose.")
    coverage: float = Field(ge=0, le=1, description="Share of questions with gold visible.")
    resident_share: float = Field(ge=0, le=1, description="Share with gold in the prefix.")


class CoverageCurve(BaseModel):
    """Coverage vs resident budget for the planner and the baselines, on the plan's index."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    questions_source: str = Field(min_length=1, max_length=4096, description="--questions.")
    questions: int = Field(ge=0, le=10_000_000, description="Questions with relevant ids.")
    log_source: str | None = Field(max_length=4096, description="The plan's query log, if any.")
    plan_budget_tokens: int = Field(ge=1, le=10_000_000, description="The plan's own budget.")
    points: tuple[CoveragePoint, ...] = Field(max_length=10_000, description="Every point.")
    notes: tuple[str, ...] = Field(default=(), max_length=100, description="Caveats.")


class BenchReport(BaseModel):
    """A whole `residency bench` run."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    kind: Literal["bench"] = Field(default="bench", description="Report kind.")
    timestamp: dt.datetime = Field(description="When the run finished (UTC).")
    server: str = Field(min_length=1, max_length=4096, description="--server base URL.")
    served_model: str = Field(min_length=1, max_length=4096, description="Model measured.")
    max_model_len: int = Field(ge=1, le=10_000_000, description="The server's max_model_len.")
    block_size: int = Field(ge=1, le=1_000_000, description="vllm:cache_config_info block_size.")
    kv_cache_tokens: int | None = Field(
        ge=0, le=1_000_000_000, description="num_gpu_blocks x block_size, if the server says."
    )
    text_source: str = Field(
        min_length=1, max_length=4096, description="Where the prompt text came from."
    )
    cached_source: CachedSource = Field(
        description="usage: per-request cached_tokens; metrics: prefix-cache hit deltas."
    )
    repeats: int = Field(ge=1, le=1_000, description="Timed warm repeats per length.")
    cold_repeats: int = Field(ge=1, le=1_000, description="Cold sends per length, each salted.")
    ttft_method: str = Field(
        default=TTFT_METHOD, max_length=4096, description="How TTFT is measured."
    )
    machine: MachineInfo | None = Field(
        default=None,
        description="The machine that ran the client (the server's own host when it is local).",
    )
    results: tuple[LengthResult, ...] = Field(max_length=1_000, description="One row per length.")
    coverage: CoverageCurve | None = Field(default=None, description="With --plan --questions.")
    warnings: tuple[str, ...] = Field(default=(), max_length=1_000, description="Caveats.")


def dump_report(report: BenchReport) -> bytes:
    """The report as indented JSON."""
    return orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2)


def load_report(data: bytes) -> BenchReport:
    """Parse and validate a dumped report."""
    return BenchReport.model_validate(orjson.loads(data))


def write_report(report: BenchReport, path: Path) -> None:
    """Write the report atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, dump_report(report) + b"\n")
