"""What choosing among several resident prefixes costs the router: `ContextBuilder.retrieve` on
the sample corpus (BM25) with a one-prefix plan and with a four-prefix plan, timed in interleaved
pairs on the same questions. The target (issue 20): at most 0.5 ms added at p50. No server."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from pytest_benchmark.fixture import BenchmarkFixture

from residency.corpus.samples import JA_SAMPLE
from residency.index import IndexOptions, build_index, open_index
from residency.planning.build import PlanOptions, log_mass
from residency.planning.multi import build_prefix_plan
from residency.planning.plan_model import CapacitySnapshot, write_plan
from residency.planning.run import index_closeness
from residency.query_log import read_query_log
from residency.serve.context import ContextBuilder
from residency.serve.settings import ServeSettings
from residency.tokenizer import LocalTokenizer

PAIRS = 400
WINDOW = 8_000  # four windows hold most of the ~36K-token sample


def _capacity() -> CapacitySnapshot:
    return CapacitySnapshot(
        model="bench", host="bench", max_model_len=WINDOW + 3_392, kv_cache_tokens=4 * WINDOW
        + 3_456, block_size=16, is_hybrid=False, resident_budget_tokens=WINDOW,
        binding_constraint="max_model_len", reasoning="bench", context_limit_tokens=WINDOW,
        concurrency_reserve_tokens=3_456, concurrent_requests=1, per_request_tokens=3_392,
    )  # fmt: skip


def test_choosing_the_prefix_adds_little_to_retrieval(
    benchmark: BenchmarkFixture, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    encoder = LocalTokenizer(tiny_tokenizer_dir)
    build_index(JA_SAMPLE.docs, tmp_path / "index", IndexOptions(dense=False), encoder, None)
    index = open_index(tmp_path / "index")
    log = read_query_log(JA_SAMPLE.queries).entries
    mass = log_mass(index, log)
    builders = {}
    for count in (1, 4):
        plan = build_prefix_plan(
            index, mass, index_closeness(index), _capacity(), encoder, PlanOptions(), count
        )
        assert len(plan.prefixes) == count
        path = tmp_path / f"plan-{count}.json"
        write_plan(plan, path)
        settings = ServeSettings(plan=path, upstreams=("x",), log=None, retriever="bm25")
        builders[count] = ContextBuilder(plan, index, settings)
    questions = [e.query for e in log[:50]]
    diffs: list[float] = []
    for n in range(PAIRS):
        q = questions[n % len(questions)]
        timed = {}
        for count in (1, 4) if n % 2 else (4, 1):  # alternate the order within a pair
            started = time.perf_counter()
            builders[count].retrieve(q)
            timed[count] = time.perf_counter() - started
        diffs.append(timed[4] - timed[1])
    added_p50_ms = statistics.median(diffs) * 1000
    benchmark.extra_info["added_p50_ms"] = added_p50_ms
    benchmark.extra_info["pairs"] = PAIRS
    benchmark(builders[4].retrieve, questions[0])
    assert added_p50_ms <= 0.5, f"choosing among 4 prefixes added {added_p50_ms:.3f} ms at p50"
