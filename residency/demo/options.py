"""What `residency demo` is asked to run (`DemoOptions`), apart from the code that runs it, so
the CLI declares its flags without importing the servers, the bench or the index."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from residency.bench.options import ColdRepeats, Lengths, Repeats
from residency.cpu_dtype import DTYPE_FLAG_HELP, CpuDtypeFlag
from residency.demo.budget import DEFAULT_TIME_BUDGET_S
from residency.flags import Flag
from residency.paths import cache_root

DemoModel = Literal["smollm2", "tiny"]
DEFAULT_TODAY = dt.date(2025, 6, 15)
DEMO_REPEATS, DEMO_COLD_REPEATS = 3, 2


class DemoOptions(BaseModel):
    """What `residency demo` runs, and where it writes."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    out_dir: Annotated[Path, Flag("--out")] = Field(
        default=Path("demo-out"),
        description="--out: directory for plan.json, query-log.jsonl, bench.json, ttft.png, "
        "demo.json and the servers' logs.",
    )
    model: Annotated[DemoModel | None, Flag("--demo-model", show_default=False)] = Field(
        default=None,
        description="smollm2: SmolLM2-135M-Instruct, real weights, on the English sample; tiny: "
        "a random-weight model on the Japanese sample (default: smollm2 where its extra is "
        "installed, else tiny).",
    )
    time_budget_s: Annotated[float, Flag("--time-budget")] = Field(
        default=DEFAULT_TIME_BUDGET_S,
        gt=0,
        le=86_400,
        description="--time-budget: seconds the whole run should take: the TTFT comparison "
        "keeps the lengths a measured prefill rate fits in what is left.",
    )
    lengths: Lengths = None  # as given, not scaled to the budget
    repeats: Repeats = None
    cold_repeats: ColdRepeats = None
    keep_running: bool = Field(
        default=False, description="Leave vLLM and the router up afterwards and print their URLs."
    )
    cache_dir: Path = Field(
        default_factory=cache_root, description="Model, tokenizer and index cache."
    )
    python: Annotated[Path, Flag(show_default=False)] = Field(
        default=Path(sys.executable),
        description="Interpreter that runs vLLM's CPU server (default: this one).",
    )
    dtype: CpuDtypeFlag = Field(default="auto", description=DTYPE_FLAG_HELP)
    kv_cache_space_gib: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="VLLM_CPU_KVCACHE_SPACE (GiB; default: 1 in bfloat16, 2 in float32, the same "
        "46,592 KV tokens for SmolLM2).",
    )
    today: dt.date = Field(default=DEFAULT_TODAY, description="--today for time expressions.")
    startup_timeout_s: float = Field(
        default=600.0, gt=0, le=3600, description="Longest wait for a server's /health."
    )

    @property
    def warm_sends(self) -> int:
        """--repeats, or the demo's own default (fewer than bench's: a short run)."""
        return self.repeats or DEMO_REPEATS

    @property
    def cold_sends(self) -> int:
        """--cold-repeats, or the demo's own default."""
        return self.cold_repeats or DEMO_COLD_REPEATS
