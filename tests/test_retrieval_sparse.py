"""BM25: scores against a reference implementation of the same formula, save/load, bad input."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from residency.errors import ConfigError, CorpusError
from residency.retrieval import BM25Retriever, CjkBigramTokenizer

DOCS = {
    "tokyo": "東京は日本の首都であり、人口が最も多い都市です。",
    "osaka": "大阪は日本第二の都市で、食い倒れの街として知られる。",
    "kyoto": "京都は千年の都。寺と神社が多く、東京からの観光客も多い。",
    "gpu": "vLLM serves models on a GPU with a KV cache and prefix caching.",
    "mixed": "GPUのKVキャッシュは東京のデータセンターにある。",
    "long": "東京 " * 12 + "日本",
}
QUERIES = [
    pytest.param("日本の首都はどこ", id="ja-question"),
    pytest.param("東京", id="repeated-in-docs"),
    pytest.param("東京東京の都市", id="query-term-repeated"),
    pytest.param("KV cache GPU", id="latin"),
    pytest.param("ＧＰＵのキャッシュ", id="fullwidth-mixed"),
    pytest.param("存在しない語彙", id="no-match"),
]
PARAMS = [
    pytest.param(1.5, 0.75, id="default"),
    pytest.param(1.2, 0.5, id="k1-1.2-b-0.5"),
    pytest.param(2.0, 0.0, id="no-length-norm"),
    pytest.param(0.9, 1.0, id="full-length-norm"),
]


def reference_bm25(docs: list[list[str]], query: list[str], k1: float, b: float) -> list[float]:
    """Lucene BM25 written out (Kamphuis et al., ECIR 2020), each query occurrence counted."""
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    df = Counter(t for d in docs for t in set(d))
    out = []
    for doc in docs:
        tf = Counter(doc)
        score = 0.0
        for term in query:
            if tf[term]:
                idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                score += idf * tf[term] / (tf[term] + k1 * (1 - b + b * len(doc) / avgdl))
        out.append(score)
    return out


class WhitespaceTokenizer:
    """A second, real tokenizer: lets a test build an index the default one must refuse."""

    name = "whitespace-test"

    def tokenize(self, text: str) -> list[str]:
        return text.split()

    tokenize_query = tokenize


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    return BM25Retriever.build(list(DOCS), list(DOCS.values()), CjkBigramTokenizer())


@pytest.mark.parametrize(("k1", "b"), PARAMS)
@pytest.mark.parametrize("query", QUERIES)
def test_scores_match_reference(query: str, k1: float, b: float) -> None:
    tokenizer = CjkBigramTokenizer()
    retriever = BM25Retriever.build(list(DOCS), list(DOCS.values()), tokenizer, k1=k1, b=b)
    expected = reference_bm25(
        [tokenizer.tokenize(d) for d in DOCS.values()], tokenizer.tokenize_query(query), k1, b
    )
    assert retriever.scores(query).tolist() == pytest.approx(expected, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("query", QUERIES)
def test_search_ranks_by_reference_score(bm25: BM25Retriever, query: str) -> None:
    tokenizer = CjkBigramTokenizer()
    ref = reference_bm25(
        [tokenizer.tokenize(d) for d in DOCS.values()], tokenizer.tokenize_query(query), 1.5, 0.75
    )
    expected = [i for _, i in sorted((-s, i) for i, s in zip(DOCS, ref, strict=True) if s > 0)]
    hits = bm25.search(query, k=10)
    assert [h.id for h in hits] == expected
    assert [h.rank for h in hits] == list(range(1, len(expected) + 1))


def test_search_truncates_to_k(bm25: BM25Retriever) -> None:
    hits = bm25.search("東京", k=2)
    assert [h.rank for h in hits] == [1, 2]
    assert hits[0].score >= hits[1].score > 0


def test_acronym_outweighs_a_generic_japanese_phrase() -> None:
    # JSQuAD's "UNTSOを日本語でこたえよ" ranked its paragraph 46th: 日本語で gives seven terms,
    # UNTSO one. The query counts UNTSO QUERY_WORD_WEIGHT times (tokenize_ja).
    places = ["港の灯台", "山の天気", "川の水位", "駅の時刻表", "図書館の蔵書", "市場の野菜"]
    docs = {
        f"notice-{i}": f"{places[i % 6]}の案内は日本語でも書かれ、第{i}回の会議で見直した。"
        for i in range(40)
    }
    docs["untso"] = "UNTSOは、日本語では国際連合休戦監視機構と呼ばれ、1948年に中東に置かれた。"
    docs["lesson"] = "問いに日本語で答えるのがよい。"
    tokenizer = CjkBigramTokenizer()
    retriever = BM25Retriever.build(list(docs), list(docs.values()), tokenizer)
    question = "UNTSOを日本語でこたえよ"
    assert [h.id for h in retriever.search(question, k=2)] == ["untso", "lesson"]
    terms = [tokenizer.tokenize(d) for d in docs.values()]
    unweighted = reference_bm25(terms, tokenizer.tokenize(question), 1.5, 0.75)
    assert unweighted[list(docs).index("lesson")] > unweighted[list(docs).index("untso")]


def test_ties_break_by_insertion_order() -> None:
    retriever = BM25Retriever.build(
        ["z", "a", "m"], ["同じ文", "同じ文", "別"], CjkBigramTokenizer()
    )
    assert [h.id for h in retriever.search("同じ", k=3)] == ["z", "a"]


def test_save_load_round_trip(bm25: BM25Retriever, tmp_path: Path) -> None:
    bm25.save(tmp_path)
    loaded = BM25Retriever.load(tmp_path, CjkBigramTokenizer())
    for query in ("日本の首都", "KV cache", "京都の寺"):
        assert loaded.search(query, k=5) == bm25.search(query, k=5)
    assert (loaded.k1, loaded.b) == (1.5, 0.75)


def test_load_refuses_another_tokenizer(bm25: BM25Retriever, tmp_path: Path) -> None:
    bm25.save(tmp_path)
    with pytest.raises(ConfigError, match=r"cjk-bigram-v1.*whitespace-test"):
        BM25Retriever.load(tmp_path, WhitespaceTokenizer())


@pytest.mark.parametrize(
    "directory", [pytest.param("missing", id="no-dir"), pytest.param(".", id="empty-dir")]
)
def test_load_without_index_is_config_error(tmp_path: Path, directory: str) -> None:
    with pytest.raises(ConfigError, match="no BM25 index"):
        BM25Retriever.load(tmp_path / directory, CjkBigramTokenizer())


@pytest.mark.parametrize("k", [0, -1, True], ids=["zero", "negative", "bool"])
def test_bad_k(bm25: BM25Retriever, k: int) -> None:
    with pytest.raises(ValueError, match="k must be a positive int"):
        bm25.search("東京", k)


@pytest.mark.parametrize(
    ("ids", "texts", "error"),
    [
        pytest.param(["a", "a"], ["東京", "大阪"], CorpusError, id="duplicate-id"),
        pytest.param(["a"], ["東京", "大阪"], ValueError, id="length-mismatch"),
        pytest.param([], [], CorpusError, id="empty"),
        pytest.param(["a"], ["。、！"], CorpusError, id="no-terms"),
    ],
)
def test_bad_corpus(ids: list[str], texts: list[str], error: type[Exception]) -> None:
    with pytest.raises(error):
        BM25Retriever.build(ids, texts, CjkBigramTokenizer())


def zipf_corpus(n_docs: int, seed: int) -> list[str]:
    """Japanese-like docs: a few very common characters (like particles) and many rare ones."""
    rng = np.random.default_rng(seed)
    pool = np.array(list("のはにをがと") + [chr(0x4E00 + i) for i in range(400)])
    weights = 1.0 / np.arange(1, len(pool) + 1)
    weights /= weights.sum()
    return [
        "".join(rng.choice(pool, size=int(rng.integers(20, 80)), p=weights)) for _ in range(n_docs)
    ]


@pytest.mark.parametrize("k", [1, 3, 10, 40], ids=lambda k: f"k{k}")
@pytest.mark.parametrize(
    "prune_min_df",
    [
        # measured on these queries: MaxScore prunes for about half of them at 100 (the
        # fallback runs for the rest), and for all of them at 300
        pytest.param(100, id="prune-some"),
        pytest.param(300, id="prune-all"),
    ],
)
def test_pruned_search_equals_exhaustive(k: int, prune_min_df: int) -> None:
    docs = zipf_corpus(600, seed=1)
    ids = [f"d{i}" for i in range(len(docs))]
    pruned = BM25Retriever.build(ids, docs, CjkBigramTokenizer(), prune_min_df=prune_min_df)
    exhaustive = BM25Retriever.build(ids, docs, CjkBigramTokenizer(), prune_min_df=10**9)
    queries = [d[5:25] for d in zipf_corpus(60, seed=2)] + [docs[7][:12], docs[99][10:30]]
    for query in queries:
        got, want = pruned.search(query, k), exhaustive.search(query, k)
        # float32 sums in another term order may differ in the last bit; ranks may not
        assert [h.id for h in got] == [h.id for h in want], query
        assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-6)
