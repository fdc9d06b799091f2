"""One re-plan decision on a 10^6-line query log with the default window of 500 (issue 42,
reproduction 5: ~18 s and 0.71-1.57 GB per cycle when the whole log was read): the router's
reader (`read_window`, from the log's end) against the whole-file reader it replaced, each in a
fresh process (`benchmarks/replan_rss.py`), so each peak RSS is its own. Targets: <= 2 s per
decision and <= 200 MB of RSS growth. The log (router-style lines, 1,000 sources, the English
sample's questions, ~180 MB) is generated once into ``.cache/replan/``.

``RESIDENCY_BENCH_REPLAN_LINES`` (default 1000000) sets its length.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from cli_plan import plan_with_cli

from residency.corpus.samples import EN_SAMPLE
from residency.index import IndexOptions, build_index
from residency.tokenizer import ApproxTokenizer

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE = REPO_ROOT / ".cache" / "replan"
SCRIPT = Path(__file__).with_name("replan_rss.py")
LINES = int(os.environ.get("RESIDENCY_BENCH_REPLAN_LINES", "1000000"))
WINDOW = 500
SECONDS_LIMIT = 2.0
GROWTH_LIMIT_MB = 200.0


def write_log(path: Path, lines: int) -> Path:
    """`lines` router-style query-log lines (written once, kept in the cache)."""
    if path.is_file():
        return path
    questions = [
        str(orjson.loads(x)["query"]) for x in EN_SAMPLE.questions.read_bytes().splitlines()
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        for i in range(lines):
            record = {
                "query": questions[i % len(questions)],
                "count": 1,
                "ts": "2026-12-07T10:00:00Z",
                "endpoint": "chat",
                "route": "resident",
                "prefix": "p0",
                "retrieved": ["manual-1"],
                "chunks": [],
                "outcome": "ok",
                "source": f"addr:{i % 1000:012d}",
                "status_code": 200,
                "prompt_tokens": 900,
                "cached_tokens": 880,
                "retrieval_ms": 1.2,
                "total_ms": 210.0,
            }
            f.write(orjson.dumps(record) + b"\n")
    tmp.rename(path)
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("replan-bench")
    build_index(EN_SAMPLE.docs, root / "index", IndexOptions(dense=False), ApproxTokenizer(), None)
    return write_log(CACHE / f"queries-{LINES}.jsonl", LINES), root / "index"


def make_plan(index: Path, out: Path, prefixes: str | None) -> Path:
    more = ["--prefixes", prefixes] if prefixes else []
    return plan_with_cli(index, out, 8192, *more, cwd=REPO_ROOT, timeout_s=None)


# forced: one prefix; auto: a plan whose prefix count `residency plan` chose. Re-planning keeps
# the served plan's count (one packing per decision): searching every count again cost 25
# packings on this sample, ~1.3 s each in planner/selection.py's knapsack (16.2 s a decision).
@pytest.mark.parametrize("prefixes", ["1", None], ids=["forced-1", "auto"])
@pytest.mark.parametrize("mode", ["tail", "whole"])
def test_replan_decision_on_a_million_line_log(
    benchmark: Any, served: tuple[Path, Path], tmp_path: Path, mode: str, prefixes: str | None
) -> None:
    log, index = served
    plan = make_plan(index, tmp_path / "plan.json", prefixes)
    command = [sys.executable, str(SCRIPT), str(log), str(index), str(plan), str(WINDOW), mode]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result: dict[str, Any] = {}

    def run() -> None:
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        assert done.returncode == 0, done.stderr
        result.update(json.loads(done.stdout.splitlines()[-1]))

    benchmark.pedantic(run, rounds=1, iterations=1)
    growth = result["peak_rss_mb"] - result["rss_before_mb"]
    benchmark.extra_info.update(result, growth_mb=growth, log_mb=log.stat().st_size / 2**20)
    said = f"{result['seconds']:.2f} s (read {result['read_s']:.2f} s), RSS +{growth:.0f} MB"
    print(f"\n{mode} {prefixes or 'auto'}: {said}, log {log.stat().st_size / 2**20:.0f} MB")
    if mode == "tail":
        assert result["read_s"] <= SECONDS_LIMIT / 10
        assert growth <= GROWTH_LIMIT_MB
    if mode == "tail":
        assert result["seconds"] <= SECONDS_LIMIT
