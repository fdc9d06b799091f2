"""What choosing among several resident prefixes costs the router: `ContextBuilder.retrieve` on
the sample corpus (BM25) with a one-prefix plan and with a four-prefix plan, timed in interleaved
pairs on the same questions. The target (issue 20): at most 0.5 ms added at p50. And what the
second retrieval hop (`--hops 2`) costs beside one hop: a pivot chunk's first ranking (one more
search), then its cached ranking (at most 0.5 ms at p50). And what showing the top sections
wherever they live (`--spread 5`, the default) costs beside `--spread 0` (at most 0.5 ms at p50).
No server."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from pytest_benchmark.fixture import BenchmarkFixture

from residency.context.builder import ContextBuilder
from residency.context.routing import RoutingSettings
from residency.context.settings import ContextSettings
from residency.corpus.samples import JA_SAMPLE
from residency.index import IndexOptions, build_index, open_index
from residency.planning.build import PlanOptions, log_mass
from residency.planning.multi import build_prefix_plan
from residency.planning.plan_model import CapacitySnapshot, write_plan
from residency.planning.run import index_closeness
from residency.query_log import read_query_log
from residency.tokenizer import LocalTokenizer

PAIRS = 400
WINDOW = 8_000  # four windows hold most of the ~36K-token sample


def _capacity() -> CapacitySnapshot:
    return CapacitySnapshot(
        model="bench",
        host="bench",
        max_model_len=WINDOW + 3_392,
        kv_cache_tokens=4 * WINDOW + 3_456,
        block_size=16,
        is_hybrid=False,
        resident_budget_tokens=WINDOW,
        binding_constraint="max_model_len",
        reasoning="bench",
        context_limit_tokens=WINDOW,
        concurrency_reserve_tokens=3_456,
        concurrent_requests=1,
        per_request_tokens=3_392,
    )


def _builders(
    tmp_path: Path, tokenizer_dir: Path, variants: dict[str, tuple[int, int] | tuple[int, int, int]]
) -> tuple[dict[str, ContextBuilder], list[str]]:
    """One ContextBuilder per variant name: (prefix count, hops[, spread]), over the Japanese
    sample."""
    encoder = LocalTokenizer(tokenizer_dir)
    build_index(JA_SAMPLE.docs, tmp_path / "index", IndexOptions(dense=False), encoder, None)
    index = open_index(tmp_path / "index")
    log = read_query_log(JA_SAMPLE.queries).entries
    mass = log_mass(index, log)
    builders = {}
    for name, variant in variants.items():
        count, hops = variant[:2]
        spread = variant[2] if len(variant) > 2 else RoutingSettings().spread
        plan = build_prefix_plan(
            index, mass, index_closeness(index), _capacity(), encoder, PlanOptions(), count
        )
        assert len(plan.prefixes) == count
        path = tmp_path / f"plan-{name}.json"
        write_plan(plan, path)
        settings = ContextSettings(
            retriever="bm25", routing=RoutingSettings(hops=hops, spread=spread)
        )
        builders[name] = ContextBuilder(plan, index, settings)
    return builders, [e.query for e in log]


def _paired_p50_ms(
    builders: dict[str, ContextBuilder], questions: list[str], a: str, b: str, pairs: int
) -> float:
    """p50 of retrieve(b) - retrieve(a) in ms, over interleaved pairs (order alternated)."""
    diffs: list[float] = []
    for n in range(pairs):
        q = questions[n % len(questions)]
        timed = {}
        for name in (a, b) if n % 2 else (b, a):
            started = time.perf_counter()
            builders[name].retrieve(q)
            timed[name] = time.perf_counter() - started
        diffs.append(timed[b] - timed[a])
    return statistics.median(diffs) * 1000


def test_the_second_hop_costs_one_search_then_little(
    benchmark: BenchmarkFixture, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    builders, log = _builders(tmp_path, tiny_tokenizer_dir, {"one": (4, 1), "two": (4, 2)})
    questions = list(dict.fromkeys(log))
    cold_ms = _paired_p50_ms(builders, questions, "one", "two", len(questions))
    warm_ms = _paired_p50_ms(builders, questions, "one", "two", PAIRS)
    benchmark.extra_info["cold_added_p50_ms"] = cold_ms
    benchmark.extra_info["warm_added_p50_ms"] = warm_ms
    benchmark.extra_info["questions"] = len(questions)
    benchmark(builders["two"].retrieve, questions[0])
    assert warm_ms <= 0.5, f"a cached second hop added {warm_ms:.3f} ms at p50"


def test_choosing_the_prefix_adds_little_to_retrieval(
    benchmark: BenchmarkFixture, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    named, log = _builders(tmp_path, tiny_tokenizer_dir, {"1": (1, 2), "4": (4, 2)})
    builders = {int(k): v for k, v in named.items()}
    questions = log[:50]
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


def test_showing_the_top_sections_adds_little_to_retrieval(
    benchmark: BenchmarkFixture, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    variants = {"off": (4, 1, 0), "on": (4, 1, RoutingSettings().spread)}
    builders, log = _builders(tmp_path, tiny_tokenizer_dir, variants)
    questions = list(dict.fromkeys(log))
    added_ms = _paired_p50_ms(builders, questions, "off", "on", PAIRS)
    benchmark.extra_info["added_p50_ms"] = added_ms
    benchmark.extra_info["pairs"] = PAIRS
    benchmark(builders["on"].retrieve, questions[0])
    assert added_ms <= 0.5, f"the top sections added {added_ms:.3f} ms at p50"
