"""What `residency demo` is asked to run (`DemoOptions`), apart from the code that runs it, so
the CLI declares its flags without importing the servers, the bench or the index."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from residency.demo.budget import DEFAULT_TIME_BUDGET_S
from residency.paths import cache_root

DemoModel = Literal["smollm2", "tiny"]
DEFAULT_TODAY = dt.date(2025, 6, 15)


class DemoOptions(BaseModel):
    """What `residency demo` runs, and where it writes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    out_dir: Path = Field(default=Path("demo-out"), description="--out: where artefacts go.")
    model: DemoModel | None = Field(
        default=None,
        description="--model: smollm2 (real weights, English sample) or tiny (random weights, "
        "Japanese sample); None: smollm2 where the real-model extra is installed.",
    )
    time_budget_s: float = Field(
        default=DEFAULT_TIME_BUDGET_S, gt=0, le=86_400, description="--time-budget (seconds)."
    )
    lengths: tuple[int, ...] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="--lengths (tokens); None: chosen from the measured prefill rate.",
    )
    repeats: int = Field(default=3, ge=1, le=1_000, description="--repeats: timed warm sends.")
    cold_repeats: int = Field(default=2, ge=1, le=1_000, description="Salted cold sends/length.")
    keep_running: bool = Field(default=False, description="--keep-running: leave servers up.")
    cache_dir: Path = Field(
        default_factory=cache_root, description="Model, tokenizer and index cache."
    )
    python: Path = Field(default=Path(sys.executable), description="Interpreter that runs vLLM.")
    kv_cache_space_gib: int = Field(
        default=1, ge=1, le=1024, description="VLLM_CPU_KVCACHE_SPACE (GiB)."
    )
    today: dt.date = Field(default=DEFAULT_TODAY, description="--today for time expressions.")
    startup_timeout_s: float = Field(
        default=600.0, gt=0, le=3600, description="Longest wait for a server's /health."
    )
