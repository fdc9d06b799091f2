"""Cold vs warm TTFT at 2K, 8K, 16K and 30K prompt tokens on real vLLM CPU servers (tiny dense
Qwen2 and tiny hybrid Qwen3-Next, max_model_len 32768, 1 GiB KV cache: over 500K tokens for the
dense model, so a 30K warm prompt survives the next 30K cold one).

`residency.bench.run_bench` per model: each length gets COLD_REPEATS cold sends, each with a
fresh random salt at the start (vLLM reports < one block cached, checked), then the last cold
prompt is re-sent until it hits (hybrid align mode may need a second sighting) and WARM_REPEATS
sends are timed. Target: median warm / median cold <= 0.10 at 16K and 30K, both models.
Each model's report (JSON) and picture (PNG) land in `.cache/bench/ttft-<model>.{json,png}`;
docs/results.md's table is built from the JSON. About 3 minutes per model on 2 cores.
Run: `pytest benchmarks/test_bench_ttft.py --benchmark-only`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from residency.bench import BenchOptions, BenchReport, plot_bench, run_bench, write_report

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))  # the vLLM server harness lives beside the tests
from vllm_server import VllmServer  # noqa: E402

OUT_DIR = REPO_ROOT / ".cache" / "bench"
SERVER_ARGS = ("--enforce-eager", "--enable-prompt-tokens-details", "--enable-prefix-caching")
MAX_MODEL_LEN = 32768
KV_CACHE_SPACE_GIB = 1
LENGTHS = (2000, 8000, 16000, 30000)
TARGET_FROM_TOKENS = 16000
TARGET_RATIO = 0.10
COLD_REPEATS = 2
WARM_REPEATS = 5

pytestmark = pytest.mark.vllm


@pytest.fixture
def server(
    request: pytest.FixtureRequest, model_dirs: dict[str, Path], tmp_path: Path
) -> Iterator[VllmServer]:
    """A server for the parametrized model kind, stopped after the test."""
    kind: str = request.param
    with VllmServer(
        model_dirs[kind],
        log_path=tmp_path / f"{kind}.log",
        max_model_len=MAX_MODEL_LEN,
        kv_cache_space_gib=KV_CACHE_SPACE_GIB,
        extra_args=SERVER_ARGS,
    ) as started:
        yield started


@pytest.mark.parametrize("server", ["dense", "hybrid"], indirect=True)
def test_ttft_cold_vs_warm_by_length(benchmark: BenchmarkFixture, server: VllmServer) -> None:
    kind = server.model_dir.name
    options = BenchOptions(
        server=server.base_url,
        lengths=LENGTHS,
        repeats=WARM_REPEATS,
        cold_repeats=COLD_REPEATS,
    )
    reports: list[BenchReport] = []
    benchmark.pedantic(lambda: reports.append(run_bench(options)), rounds=1, iterations=1)
    report = reports[0]
    write_report(report, OUT_DIR / f"ttft-{kind}.json")
    plot_bench(report, OUT_DIR / f"ttft-{kind}.png")
    benchmark.extra_info.update(
        {
            "model": kind,
            "block_size": report.block_size,
            "kv_cache_tokens": report.kv_cache_tokens,
            "ttft_method": report.ttft_method,
            "lengths": {
                row.label: {
                    "median_cold_ttft_s": round(row.cold.median_s, 4),
                    "median_warm_ttft_s": round(row.warm.median_s, 4),
                    "warm_over_cold": round(row.warm_over_cold or 0.0, 4),
                    "cold_ttft_s": [round(t, 4) for t in row.cold_ttft_s],
                    "warm_ttft_s": [round(t, 4) for t in row.warm_ttft_s],
                    "cold_cached_tokens": list(row.cold_cached_tokens),
                    "warm_cached_tokens": list(row.warm_cached_tokens),
                    "expected_cached_tokens": row.expected_cached_tokens,
                    "admit_sends": row.admit_sends,
                }
                for row in report.results
            },
        }
    )
    for row in report.results:
        assert row.cold_verified, row
        assert row.warm_resident, row
        if row.prompt_tokens >= TARGET_FROM_TOKENS:
            assert row.warm_over_cold is not None
            assert row.warm_over_cold <= TARGET_RATIO, row
