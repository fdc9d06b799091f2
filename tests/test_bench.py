"""`residency bench` against the real vLLM CPU dense server: cold sends are salted so that vLLM
reports (almost) nothing cached, warm sends hit every full block, and the CLI prints a table,
JSON, a PNG, and one clean line for impossible lengths. Behaviour only: no timing asserts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from residency_cli import run_cli
from vllm_server import REPO_ROOT, VllmServer

from residency.bench import (
    BenchOptions,
    BenchReport,
    dump_report,
    load_report,
    plot_bench,
    run_bench,
)
from residency.bench.ttft import salted
from residency.index import IndexOptions, build_index
from residency.tokenizer import LocalTokenizer

CORPUS = REPO_ROOT / "residency" / "data" / "corpora" / "harbor-lights" / "docs"
QUESTIONS = REPO_ROOT / "residency" / "data" / "corpora" / "harbor-lights" / "qa.jsonl"
BLOCK = 128  # the dense tiny model's block size on the CPU backend
LENGTHS = (1000, 4000)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_bench_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`residency bench ARGS` through the CLI's own entry point."""
    return run_cli("bench", *args, timeout=timeout)


def test_salt_replaces_the_last_tokens_and_keeps_the_length() -> None:
    assert salted([9, 8], [1, 2, 3, 4]) == [9, 8, 1, 2]


@pytest.fixture(scope="module")
def report(vllm_dense_server: VllmServer) -> BenchReport:
    """A short library run: two lengths, two cold and two warm sends each."""
    options = BenchOptions(
        server=vllm_dense_server.base_url, lengths=LENGTHS, repeats=2, cold_repeats=2
    )
    return run_bench(options)


@pytest.mark.vllm
def test_cold_sends_find_nothing_cached_and_warm_sends_hit_every_full_block(
    report: BenchReport,
) -> None:
    assert report.served_model == "tiny"
    assert report.block_size == BLOCK
    assert report.cached_source == "usage"
    assert [r.label for r in report.results] == ["1000", "4000"]
    for row, n in zip(report.results, LENGTHS, strict=True):
        assert row.prompt_tokens == n
        assert row.expected_cached_tokens == (n - 1) // BLOCK * BLOCK
        assert len(row.cold_cached_tokens) == 2
        assert len(row.warm_cached_tokens) == 2
        assert all(c < BLOCK for c in row.cold_cached_tokens), row
        assert all(c >= n - BLOCK for c in row.warm_cached_tokens), row
        assert row.cold_verified
        assert row.warm_resident
        assert row.admit_sends >= 1
        assert row.cold.min_s <= row.cold.median_s <= row.cold.max_s
        assert row.warm_over_cold == pytest.approx(row.warm.median_s / row.cold.median_s)
    assert report.warnings == ()


@pytest.mark.vllm
def test_report_round_trips_and_plots_a_png(report: BenchReport, tmp_path: Path) -> None:
    assert load_report(dump_report(report)) == report
    out = tmp_path / "plots" / "ttft.png"
    plot_bench(report, out)
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 10_000
    assert [p.name for p in out.parent.iterdir()] == ["ttft.png"]  # no temp file left behind


@pytest.fixture(scope="module")
def dense_plan(
    vllm_dense_server: VllmServer,
    tiny_tokenizer_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """`residency plan --server URL` over a BM25-only index of the sample corpus."""
    work = tmp_path_factory.mktemp("bench-plan")
    tokenizer = tiny_tokenizer_dir
    build_index(CORPUS, work / "index", IndexOptions(dense=False), LocalTokenizer(tokenizer))
    done = run_cli(
        *("plan", "--server", vllm_dense_server.base_url),
        *("--platform", "cpu", "--index", str(work / "index"), "-o", str(work / "plan.json")),
        *("--prefixes", "1"),
    )
    assert done.returncode == 0, done.stderr
    return work / "plan.json"


@pytest.mark.vllm
def test_cli_json_with_plan_measures_its_prefix_and_plots_coverage(
    vllm_dense_server: VllmServer, dense_plan: Path, tmp_path: Path
) -> None:
    png = tmp_path / "bench.png"
    done = run_bench_cli(
        *("--server", vllm_dense_server.base_url, "--plan", str(dense_plan)),
        *("--lengths", "1000", "--repeats", "1", "--cold-repeats", "1", "--json"),
        *("--questions", str(QUESTIONS), "--plot", str(png)),
    )
    assert done.returncode == 0, done.stderr
    report = BenchReport.model_validate(json.loads(done.stdout))
    labels = [r.label for r in report.results]
    assert labels == ["1000", "plan"]
    plan_row = report.results[1]
    assert plan_row.prompt_tokens > 20_000  # the ~29K-token prefix, chat-rendered
    assert max(plan_row.cold_cached_tokens) < BLOCK
    assert min(plan_row.warm_cached_tokens) == plan_row.expected_cached_tokens
    assert report.text_source.startswith("plan prefix")
    curve = report.coverage
    assert curve is not None
    assert curve.questions > 50
    strategies = {p.strategy for p in curve.points}
    assert {"planner", "frequency", "density", "random", "cag", "rag-top3"} <= strategies
    full = {p.strategy: p for p in curve.points if p.budget_tokens == curve.plan_budget_tokens}
    assert full["planner"].coverage >= full["rag-top3"].coverage
    assert png.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.vllm
def test_cli_table_for_people(vllm_dense_server: VllmServer) -> None:
    done = run_bench_cli(
        *("--server", vllm_dense_server.base_url, "--lengths", "1000"),
        *("--repeats", "1", "--cold-repeats", "1"),
    )
    assert done.returncode == 0, done.stderr
    assert "warm/cold" in done.stdout
    assert "1,000" in done.stdout
    assert "salted" in done.stdout


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("lengths", "expected"),
    [
        pytest.param("2000,40000", ["--lengths 40000", "max_model_len 32768", "32767"], id="long"),
        pytest.param("100", ["--lengths 100", "128-token block"], id="one-block"),
        pytest.param("2k", ["--lengths '2k'", "comma-separated"], id="not-a-number"),
    ],
)
def test_bad_lengths_give_one_line_and_exit_1(
    vllm_dense_server: VllmServer, lengths: str, expected: list[str]
) -> None:
    done = run_bench_cli("--server", vllm_dense_server.base_url, "--lengths", lengths, "--json")
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error:")
    for part in expected:
        assert part in lines[0]
