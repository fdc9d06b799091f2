"""The demo's report (demo.json): what ran, on which machine, in how long."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from residency.bench import BenchReport
from residency.cpu_dtype import DtypeChoice
from residency.demo.options import DemoModel
from residency.demo.questions import QuestionResult
from residency.demo.servers import ProcessInfo
from residency.machine import MachineInfo
from residency.warm import WarmReport


class StepResult(BaseModel):
    """One finished step and how long it took."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str = Field(min_length=1, max_length=64, description="Step name.")
    seconds: float = Field(ge=0, le=86_400, description="Wall time of the step.")
    detail: str = Field(max_length=4096, description="What it produced.")


class PrefillProbe(BaseModel):
    """The measured cold-prefill rate the comparison was sized from."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    probes: tuple[tuple[int, float], ...] = Field(
        max_length=8, description="(prompt tokens, cold TTFT seconds) of each salted probe."
    )
    per_token_s: float = Field(ge=0, description="Fitted a of t(n) = a·n + b·n².")
    per_token_pair_s: float = Field(ge=0, description="Fitted b of t(n) = a·n + b·n².")
    tokens_per_s_at_2k: float = Field(ge=0, description="Predicted prefill throughput at 2,048.")


class DemoReport(BaseModel):
    """A whole demo run (demo.json)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    kind: Literal["demo"] = Field(default="demo", description="Report kind.")
    timestamp: dt.datetime = Field(description="When the run finished (UTC).")
    machine: MachineInfo = Field(description="Where every time in this report was measured.")
    out_dir: str = Field(min_length=1, max_length=4096, description="--out.")
    model: DemoModel = Field(description="smollm2 (real weights) or tiny (random weights).")
    served_model: str = Field(min_length=1, max_length=256, description="vLLM's model name.")
    model_dir: str = Field(min_length=1, max_length=4096, description="The model served.")
    dtype: DtypeChoice = Field(description="The vLLM server's --dtype and why it was chosen.")
    sample: str = Field(min_length=1, max_length=256, description="The sample corpus planned.")
    plan_path: str = Field(min_length=1, max_length=4096, description="plan.json.")
    query_log: str = Field(min_length=1, max_length=4096, description="The router's query log.")
    bench_path: str | None = Field(max_length=4096, description="bench.json (None: no bench).")
    plot_path: str | None = Field(max_length=4096, description="ttft.png (None: no bench).")
    prefix_tokens: int = Field(ge=0, le=10_000_000, description="Tokens of the plan's prefix.")
    resident_budget_tokens: int = Field(ge=0, le=10_000_000, description="The plan's budget.")
    resident_sections: int = Field(ge=0, le=10_000_000, description="Sections resident.")
    total_sections: int = Field(ge=0, le=10_000_000, description="Sections in the index.")
    prefix_tokens_by_id: dict[str, int] = Field(
        default_factory=dict, max_length=1024, description="Tokens of every resident prefix."
    )
    corpus_tokens: int | None = Field(
        default=None, ge=0, le=1_000_000_000, description="Tokens of all sections of the corpus."
    )
    resident_corpus_tokens: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000_000,
        description="Tokens of the sections resident in any prefix, each counted once.",
    )
    servers: tuple[ProcessInfo, ...] = Field(
        max_length=16, description="Every server the demo started (process groups)."
    )
    kept_running: bool = Field(description="Servers left up (--keep-running).")
    steps: tuple[StepResult, ...] = Field(max_length=64, description="Steps, in order.")
    time_budget_s: float = Field(gt=0, description="--time-budget.")
    prefill: PrefillProbe = Field(description="The measured cold-prefill rate.")
    scaled_down: tuple[str, ...] = Field(
        max_length=16, description="What the budget left out of the comparison, and why."
    )
    warm: WarmReport = Field(description="`residency warm` on the demo's server.")
    questions: tuple[QuestionResult, ...] = Field(max_length=64, description="Router answers.")
    bench: BenchReport | None = Field(
        description="Cold vs warm TTFT, with coverage vs budget (None: the budget held none)."
    )
    total_s: float = Field(ge=0, le=86_400, description="Wall time of the whole run.")
