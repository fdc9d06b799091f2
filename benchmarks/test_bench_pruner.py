"""The listwise pruner on JSQuAD v1.3 valid: context removed, gold evidence kept, added latency.

`residency eval prune --squad valid-v1.3.json --pruner-url URL --max-questions 100` with its
defaults (top-5 chunks from the BM25-only index under ``.cache/coverage``, threshold 3, keep-top-k
2), against the tiny random-weight Qwen2 behind a vLLM CPU server started with the pruner's
structured-output flag. The grades carry no meaning (random weights): the figures measure the
plumbing (every reply schema-valid, the latency one call adds on 2 cores) and the keep-top-k floor,
which the "floor only" row isolates. Figures go to ``extra_info`` and, with the whole report, to
``.benchmarks/prune-jsquad.json``.

    .venv/bin/python -m pytest benchmarks/test_bench_pruner.py --benchmark-only
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import JSQUAD_VALID, REPO_ROOT

from residency.atomic import write_bytes_atomic
from residency.context.pruner_settings import PRUNER_SERVER_ARGS, PrunerSettings
from residency.eval.prune import PruneEvalJob, run_prune_eval
from residency.eval.prune_report import PruneEvalReport

sys.path.insert(0, str(REPO_ROOT / "tests"))  # the vLLM server harness lives beside the tests
from vllm_server import VllmServer

QUESTIONS = 100
RESULTS_PATH = REPO_ROOT / ".benchmarks/prune-jsquad.json"

pytestmark = pytest.mark.vllm


class _Quiet:
    """No progress output."""

    def start(self, description: str, total: int) -> None:
        """Nothing to show."""

    def advance(self, steps: int) -> None:
        """Nothing to show."""


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, model_dirs: dict[str, Path]
) -> Iterator[VllmServer]:
    """The tiny dense model behind vLLM with `PRUNER_SERVER_ARGS` (skips without JSQuAD)."""
    if not JSQUAD_VALID.is_file():
        pytest.skip(f"JSQuAD v1.3 valid not found at {JSQUAD_VALID} (set RESIDENCY_JSQUAD_VALID)")
    model_dir = model_dirs["dense"]
    log = tmp_path_factory.mktemp("bench-pruner") / "vllm.log"
    args = ("--enforce-eager", *PRUNER_SERVER_ARGS)
    with VllmServer(model_dir, log_path=log, extra_args=args, python=Path(sys.executable)) as s:
        yield s


def figures(report: PruneEvalReport) -> dict[str, Any]:
    """The report as flat numbers for extra_info."""
    out: dict[str, Any] = {"questions": report.questions, "k": report.settings.k}
    for row in report.rows:
        key = row.name.replace(" ", "_")
        out[f"{key}_removed_share"] = round(row.removed_share, 4)
        out[f"{key}_removed_chars_share"] = round(row.removed_chars_share, 4)
        out[f"{key}_gold_kept"] = f"{row.gold_kept}/{row.gold_retrieved}"
        out[f"{key}_gold_kept_share"] = (
            None if row.gold_kept_share is None else round(row.gold_kept_share, 4)
        )
    out["latency_mean_s"] = round(report.latency.mean_s, 3)
    out["latency_p50_s"] = round(report.latency.p50_s, 3)
    out["latency_p95_s"] = round(report.latency.p95_s, 3)
    out["invalid_outputs"] = report.invalid_outputs
    out["upstream_errors"] = report.upstream_errors
    return out


def test_jsquad_pruning(benchmark: Any, server: VllmServer) -> None:
    job = PruneEvalJob(JSQUAD_VALID, PrunerSettings(url=server.base_url), limit=QUESTIONS)
    report: PruneEvalReport = benchmark.pedantic(
        run_prune_eval, args=(job, _Quiet()), rounds=1, iterations=1
    )
    benchmark.extra_info.update(figures(report))
    write_bytes_atomic(
        RESULTS_PATH, orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
    )
    pruner, floor, _ = report.rows
    assert report.questions == QUESTIONS
    assert (report.invalid_outputs, report.upstream_errors) == (0, 0), report.first_error
    # Every question retrieves k chunks and the floor keeps exactly keep_top_k of them.
    assert floor.chunks_kept == 2 * report.questions
    assert floor.chunks_retrieved == job.k * report.questions
    # The pruner's kept set always contains the floor.
    assert pruner.chunks_kept >= floor.chunks_kept
    assert pruner.gold_kept >= floor.gold_kept
