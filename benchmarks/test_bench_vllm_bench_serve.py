"""`vllm bench serve`, the tool people reach for, against the router and directly against vLLM in
one run (tiny dense model, vLLM CPU; issue 21): the random and prefix_repetition datasets, chat
API, streaming. Every request must complete both ways.

The two are not the same work: through the router every prompt gets the plan's resident prefix
(~6K tokens here, cached after warm) and the passages BM25 retrieves for it (uncached: the
random prompts match different chunks), so its TTFT carries a prefill vLLM alone never does. The
figures report the mean prompt and cached tokens per request from the router's query log next
to the benchmark's own input length, so the difference is explained, not hidden.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from residency.index import IndexOptions, build_index
from residency.planning.plan_model import read_plan
from residency.tokenizer import LocalTokenizer

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))  # the server harnesses live beside the tests
from router_server import RouterProcess  # noqa: E402
from vllm_server import VllmServer  # noqa: E402

CORPUS = REPO_ROOT / "residency" / "data" / "corpora" / "harbor-lights" / "docs"
SERVER_ARGS = ("--enforce-eager", "--enable-prompt-tokens-details", "--enable-prefix-caching")
PROMPTS = int(os.environ.get("RESIDENCY_BENCH_SERVE_PROMPTS", "24"))
DATASETS: dict[str, tuple[str, ...]] = {
    "random": (
        "--dataset-name",
        "random",
        "--random-input-len",
        "64",
        "--random-output-len",
        "8",
    ),
    "prefix_repetition": (
        "--dataset-name",
        "prefix_repetition",
        "--prefix-repetition-prefix-len",
        "256",
        "--prefix-repetition-suffix-len",
        "64",
        "--prefix-repetition-num-prefixes",
        "2",
        "--prefix-repetition-output-len",
        "8",
    ),
}

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path, model_dirs: dict[str, Path]
) -> Iterator[dict[str, Any]]:
    """vLLM (dense tiny model), a ~6K-token plan over a BM25 index, and the router."""
    tmp = tmp_path_factory.mktemp("bench-serve")
    index_dir = tmp / "index"
    build_index(
        CORPUS, index_dir, IndexOptions(dense=False), LocalTokenizer(tiny_tokenizer_dir), None
    )
    model = model_dirs["dense"]
    server = VllmServer(model, log_path=tmp / "vllm.log", extra_args=SERVER_ARGS).start()
    try:
        plan_path = tmp / "plan.json"
        done = subprocess.run(
            [
                *(sys.executable, "-m", "residency", "plan", "--server", server.base_url),
                *("--platform", "cpu", "--index", str(index_dir), "-o", str(plan_path)),
                *("--reserve-retrieved", "24000"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        router = RouterProcess(
            plan_path, [server.base_url], tmp, ("--retriever", "bm25", "--today", "2025-06-15")
        ).start()
        try:
            yield {
                "server": server,
                "router": router,
                "plan": plan_path,
                "model": model,
                "tmp": tmp,
            }
        finally:
            router.stop()
    finally:
        server.stop()


def bench_serve(base_url: str, model: Path, dataset: str, out: Path) -> dict[str, Any]:
    """One `vllm bench serve` run; its saved result."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.cli.main",
            "bench",
            "serve",
            "--backend",
            "openai-chat",
            "--endpoint",
            "/v1/chat/completions",
            "--base-url",
            base_url,
            "--model",
            "tiny",
            "--tokenizer",
            str(model),
            *DATASETS[dataset],
            "--num-prompts",
            str(PROMPTS),
            "--max-concurrency",
            "4",
            "--seed",
            "0",
            "--save-result",
            "--result-dir",
            str(out.parent),
            "--result-filename",
            out.name,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text("utf-8"))  # type: ignore[no-any-return]


def test_vllm_bench_serve_through_the_router_and_direct(
    benchmark: BenchmarkFixture, setup: dict[str, Any]
) -> None:
    server: VllmServer = setup["server"]
    router: RouterProcess = setup["router"]
    tmp: Path = setup["tmp"]
    results: dict[str, dict[str, Any]] = {}

    def run() -> None:
        for dataset in DATASETS:
            for target, url in (("direct", server.base_url), ("router", router.base_url)):
                before = _log_lines(router)
                out = tmp / f"{dataset}-{target}.json"
                result = bench_serve(url, setup["model"], dataset, out)
                logged = _log_lines(router)[len(before) :]
                results[f"{dataset}/{target}"] = _figures(result, logged)

    benchmark.pedantic(run, rounds=1, iterations=1)
    figures = {"prefix_tokens": read_plan(setup["plan"]).prefix.token_count, **results}
    benchmark.extra_info.update(figures)
    print(json.dumps(figures, indent=2))  # the figures, for docs/serve.md
    for name, f in results.items():
        assert f["completed"] == PROMPTS, (name, f)
        assert f["failed"] == 0, (name, f)
    assert "Traceback" not in router.log_text()


def _log_lines(router: RouterProcess) -> list[dict[str, Any]]:
    text = router.query_log.read_text("utf-8") if router.query_log.exists() else ""
    return [json.loads(x) for x in text.splitlines()]


def _figures(result: dict[str, Any], logged: list[dict[str, Any]]) -> dict[str, Any]:
    out = {
        "completed": result.get("completed"),
        "failed": result.get("failed", sum(1 for e in result.get("errors", []) if e)),
        "mean_ttft_ms": round(result["mean_ttft_ms"], 1),
        "median_ttft_ms": round(result["median_ttft_ms"], 1),
        "p99_ttft_ms": round(result["p99_ttft_ms"], 1),
        "output_throughput_tok_s": round(result["output_throughput"], 2),
        "request_throughput_req_s": round(result["request_throughput"], 3),
        "bench_input_tokens_per_request": round(result["total_input_tokens"] / PROMPTS, 1),
    }
    ok = [r for r in logged if r.get("outcome") == "ok" and r.get("prompt_tokens") is not None]
    if ok:  # through the router: what vLLM really prefilled, and how much was cached
        out["router_prompt_tokens_mean"] = round(statistics.mean(r["prompt_tokens"] for r in ok))
        out["router_cached_tokens_mean"] = round(
            statistics.mean(r.get("cached_tokens") or 0 for r in ok)
        )
        out["router_logged_ok"] = len(ok)
    return out
