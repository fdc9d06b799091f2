"""The demo's steps that start a server or write an artefact, each timed and reported as it ends:
vLLM with the sample indexed meanwhile, the plan, the router, the warm, the TTFT bench."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner import CacheSettings
from residency.bench import BenchOptions, coverage_vs_budget, plot_bench, run_bench, write_report
from residency.capacity.request import CapacityRequest
from residency.corpus.samples import SampleCorpus
from residency.cpu_dtype import DtypeChoice, same_tokens_gib, with_dtype
from residency.demo.budget import LengthChoice
from residency.demo.options import DemoModel, DemoOptions
from residency.demo.report import StepResult
from residency.demo.servers import ServerSet, router_command
from residency.index import build_index, open_index
from residency.launcher import ManagedServer, free_port, vllm_command, vllm_env
from residency.planning.plan_model import ResidencyPlan, write_plan
from residency.planning.run import PlanJob, run_plan, sample_index_options
from residency.planning.settings import PlanSettings
from residency.tokenizer import LocalTokenizer
from residency.warm import WarmOptions, WarmReport, warm

# --enforce-eager skips torch.compile (server start ~25 s instead of ~60 s on 2 cores).
# Two resident prefixes: the demo shows routing between them and keeps a long tail to retrieve
# (more prefixes would hold nearly all of the English sample in SmolLM2's 1 GiB KV cache).
DEMO_PREFIXES = 2
VLLM_ARGS = ("--enforce-eager", "--enable-prompt-tokens-details", "--enable-prefix-caching")
Say = Callable[[str], None]

# The folder that holds this residency package: child processes run `python -m residency` from
# there, so they import this very code (a checkout or an installed wheel alike).
PACKAGE_PARENT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Served:
    """What the demo serves: the model, its corpus, window and answer length."""

    model: DemoModel
    served_name: str
    model_dir: Path
    tokenizer_dir: Path
    sample: SampleCorpus
    max_model_len: int
    answer_tokens: int  # random weights answer noise: few tokens; real ones get a sentence


@dataclass
class Steps:
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


def start_vllm(
    options: DemoOptions, servers: ServerSet, steps: Steps, served: Served, dtype: DtypeChoice
) -> tuple[ManagedServer, Path]:
    """Start vLLM's CPU server and index the sample while it boots; the server and index dir."""
    port = free_port()
    vllm = servers.add(
        ManagedServer(
            "vllm",
            vllm_command(
                options.python,
                served.model_dir,
                port,
                served.served_name,
                served.max_model_len,
                with_dtype(VLLM_ARGS, dtype),
            ),
            port=port,
            log_path=options.out_dir.resolve() / "vllm.log",
            env=vllm_env(options.kv_cache_space_gib or same_tokens_gib(dtype.dtype, 1)),
            cwd=PACKAGE_PARENT,
            die_with_parent=not options.keep_running,
        )
    )
    with steps.step("vllm", "starting the vLLM CPU server (indexing meanwhile)") as detail:
        vllm.spawn()
        index_dir = options.cache_dir.resolve() / f"demo-index-{served.sample.name}"
        manifest = build_index(
            served.sample.docs,
            index_dir,
            sample_index_options(served.sample, dense=False),
            LocalTokenizer(served.tokenizer_dir),
        )
        vllm.wait_healthy(options.startup_timeout_s)
        detail.append(
            f"{vllm.url}; index of {served.sample.name} ({manifest.section_count} sections, BM25)"
        )
    return vllm, index_dir


@dataclass(frozen=True, slots=True)
class Planned:
    """The plan the demo wrote, where, and how much of the corpus it holds."""

    plan: ResidencyPlan
    path: Path
    corpus_tokens: int
    resident_tokens: int

    def fields(self) -> dict[str, Any]:
        """The DemoReport fields that describe the plan."""
        plan = self.plan
        return {
            "plan_path": str(self.path),
            "prefix_tokens": plan.prefix.token_count,
            "resident_budget_tokens": plan.capacity.resident_budget_tokens,
            "resident_sections": plan.coverage.resident_sections,
            "total_sections": plan.coverage.total_sections,
            "prefix_tokens_by_id": {p.id: p.tokens for p in plan.all_prefixes()},
            "corpus_tokens": self.corpus_tokens,
            "resident_corpus_tokens": self.resident_tokens,
        }


def plan_resident(
    steps: Steps, url: str, served: Served, index_dir: Path, plan_path: Path
) -> Planned:
    """Plan the resident prefixes from the server's KV cache and write the plan."""
    with steps.step("plan", "planning the resident prefix from the server's KV cache") as detail:
        job = PlanJob(
            capacity=CapacityRequest(
                server=url,
                cache=CacheSettings(platform="cpu", max_model_len=served.max_model_len),
            ),
            index_dir=index_dir,
            logs=(str(served.sample.queries),),
            tokenizer_dir=served.tokenizer_dir,
            settings=PlanSettings(prefixes=DEMO_PREFIXES),
        )
        _, plan = run_plan(job)
        write_plan(plan, plan_path)
        corpus_tokens = sum(s.token_count for s in open_index(index_dir).sections)
        resident_tokens = plan.resident_tokens()
        detail.append(
            f"{len(plan.all_prefixes())} prefixes of up to "
            f"{plan.capacity.resident_budget_tokens:,} tokens hold "
            f"{plan.coverage.resident_sections} of {plan.coverage.total_sections} sections, "
            f"{resident_tokens:,} of {corpus_tokens:,} corpus tokens "
            f"({resident_tokens / max(corpus_tokens, 1):.0%}) → {plan_path}"
        )
    return Planned(plan, plan_path, corpus_tokens, resident_tokens)


def spawn_router(
    options: DemoOptions, servers: ServerSet, plan_path: Path, vllm_url: str, query_log: Path
) -> ManagedServer:
    """Start `residency serve` in front of vLLM; the caller waits for its health later."""
    router_port = free_port()
    router = servers.add(
        ManagedServer(
            "router",
            router_command(options, plan_path, vllm_url, router_port, query_log),
            port=router_port,
            log_path=options.out_dir.resolve() / "router.log",
            cwd=PACKAGE_PARENT,
            die_with_parent=not options.keep_running,
        )
    )
    router.spawn()
    return router


def warm_prefixes(steps: Steps, plan: ResidencyPlan, url: str) -> WarmReport:
    """Prefill every prefix and check that vLLM reports it cached."""
    with steps.step("warm", "prefilling the prefix and checking it is cached") as detail:
        warm_report = warm(plan, WarmOptions(server=url))
        cached = ", ".join(
            f"{p.id} {p.cached_tokens:,} of {p.shared_prefix_tokens:,}"
            for p in warm_report.prefixes
        )
        detail.append(
            f"tokens cached after all were warmed: {cached}; "
            f"TTFT {warm_report.cold_ttft_s:.2f} s cold → {warm_report.warm_ttft_s:.2f} s warm"
        )
    return warm_report


def run_ttft_bench(
    options: DemoOptions,
    steps: Steps,
    url: str,
    served: Served,
    plan: ResidencyPlan,
    choice: LengthChoice,
    out: Path,
) -> dict[str, Any]:
    """Cold vs warm TTFT at the chosen lengths, with the table and picture; their report fields."""
    if not (choice.lengths or choice.include_plan):
        return {"bench": None, "bench_path": None, "plot_path": None}
    bench_path, plot_path = out / "bench.json", out / "ttft.png"
    with steps.step("bench", "measuring cold vs warm TTFT per prompt length") as detail:
        bench_options = BenchOptions(
            server=url,
            lengths=choice.lengths,
            repeats=options.warm_sends,
            cold_repeats=options.cold_sends,
            text_dir=served.sample.docs,
        )
        bench = run_bench(bench_options, plan if choice.include_plan else None)
        coverage = coverage_vs_budget(plan, served.sample.questions)
        bench = bench.model_copy(update={"coverage": coverage})
        write_report(bench, bench_path)
        plot_bench(bench, plot_path)
        detail.append(f"{bench_path}, {plot_path} (predicted {choice.predicted_s:.0f} s)")
    return {"bench": bench, "bench_path": str(bench_path), "plot_path": str(plot_path)}
