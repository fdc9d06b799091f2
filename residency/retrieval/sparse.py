"""BM25 over our own tokens: bm25s builds the eager score matrix, we score and rank queries.

bm25s (method "lucene", Kamphuis et al., ECIR 2020) precomputes, per (term, document),
``idf(t) * tf / (tf + k1 * (1 - b + b * |d| / avgdl))`` with ``idf(t) = ln(1 + (N - df + 0.5) /
(df + 0.5))`` into a CSC matrix (one column per term). A query's score for a document is the sum
of its terms' columns, each term counted as often as it occurs in the query (as bm25s does);
the query's terms come from the tokenizer's ``tokenize_query`` (``tokenize_ja.QUERY_WORD_WEIGHT``).
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from residency.errors import ConfigError, CorpusError
from residency.normalize import NORMALIZATION_VERSION
from residency.retrieval.bm25s_cpu import bm25s
from residency.retrieval.protocol import Hit, check_k
from residency.retrieval.stored import check_query_side, read_meta
from residency.retrieval.tokenize_ja import Tokenizer

META_FILE = "bm25.meta.json"
# bm25s's own file layout, prefixed so a dense index can share the directory.
BM25S_FILES = {
    "data_name": "bm25.data.csc.npy",
    "indices_name": "bm25.indices.csc.npy",
    "indptr_name": "bm25.indptr.csc.npy",
    "vocab_name": "bm25.vocab.json",
    "params_name": "bm25.params.json",
}
FORMAT_VERSION: Literal[1] = 1
# Posting lists this long are scored last and only where they can still matter (see
# `BM25Retriever`); 2,048 is ~2% of a 100K-chunk index, where only particles and the commonest
# kana/kanji unigrams are that frequent.
PRUNE_MIN_DF = 2048
# Skip common terms only while their summed upper bound stays under this share of theta: a
# larger bound admits more candidates, and each costs a binary search per skipped term
# (measured at 100K chunks: skipping up to theta itself made queries slower, 6 ms vs 3 ms).
SKIP_BOUND_FRACTION = 0.25


class Bm25Meta(BaseModel):
    """What `BM25Retriever.load` checks before trusting the bm25s files beside it."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    format_version: Literal[1] = Field(description="Layout version of this directory's bm25 files")
    tokenizer: str = Field(min_length=1, description="Tokenizer name, e.g. cjk-bigram-v1")
    normalization: str = Field(min_length=1, description="residency.normalize version used")
    k1: float = Field(gt=0, description="BM25 term-frequency saturation")
    b: float = Field(ge=0, le=1, description="BM25 length normalisation")
    method: Literal["lucene"] = Field(description="bm25s scoring variant")
    ids: list[str] = Field(min_length=1, description="Document ids in index (row) order")

    @classmethod
    def written_now(cls, tokenizer: str, k1: float, b: float, ids: list[str]) -> Bm25Meta:
        """The meta of files written by this version (its format and normalization)."""
        return cls(
            format_version=FORMAT_VERSION,
            tokenizer=tokenizer,
            normalization=NORMALIZATION_VERSION,
            k1=k1,
            b=b,
            method="lucene",
            ids=ids,
        )


def check_ids(ids: Sequence[str], n_rows: int, what: str) -> None:
    """ValueError if ids and rows differ in count; CorpusError on a duplicate id."""
    if len(ids) != n_rows:
        raise ValueError(f"{what}: {len(ids)} ids for {n_rows} rows")
    if len(set(ids)) != len(ids):
        dup = next(i for i, c in Counter(ids).items() if c > 1)
        raise CorpusError(f"{what}: duplicate document id {dup!r}; ids must be unique")


def top_k(
    docs: NDArray[np.intp], scores: NDArray[np.float32], k: int
) -> tuple[NDArray[np.intp], NDArray[np.float32]]:
    """The ``k`` best (doc, score) pairs with a positive score, best first, ties by lower doc."""
    keep = scores > 0
    docs, scores = docs[keep], scores[keep]
    if len(docs) > k:
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        keep = scores >= kth
        docs, scores = docs[keep], scores[keep]
    order = np.lexsort((docs, -scores))[:k]
    return docs[order], scores[order]


class BM25Retriever:
    """Lucene-variant BM25 over a `Tokenizer`'s terms; name ``bm25``.

    Search is exact but skips most of the work for common terms (MaxScore, Turtle & Flood 1995):
    terms with posting lists of at least ``prune_min_df`` documents (particles like の, in nearly
    every chunk) wait until the rarer terms have given a k-th best partial score theta; the
    commonest of them, as many as keep the sum of their largest per-document scores below theta,
    are then looked up only for the documents within that sum of theta, by binary search (bm25s
    sorts each CSC column by document, see ``bm25s.scoring._np_csc_python``). Scores can differ
    from `scores` in the last float32 bit (another summation order); ranks do not.
    """

    name = "bm25"

    def __init__(
        self,
        ids: Sequence[str],
        model: Any,
        tokenizer: Tokenizer,
        prune_min_df: int = PRUNE_MIN_DF,
    ) -> None:
        check_ids(ids, int(model.scores["num_docs"]), "bm25 index")
        if prune_min_df <= 0:
            raise ValueError(f"prune_min_df must be positive, got {prune_min_df}")
        self.ids: tuple[str, ...] = tuple(ids)
        self.tokenizer = tokenizer
        self.prune_min_df = prune_min_df
        self._model = model
        self._vocab: dict[str, int] = model.vocab_dict
        self._data: NDArray[np.float32] = model.scores["data"]
        self._indices: NDArray[np.int32] = model.scores["indices"]
        self._indptr: NDArray[np.int64] = np.asarray(model.scores["indptr"], dtype=np.int64)
        df = np.diff(self._indptr)
        self._max_impact = np.zeros(len(df), dtype=np.float32)
        filled = df > 0
        if filled.any():
            self._max_impact[filled] = np.maximum.reduceat(self._data, self._indptr[:-1][filled])

    @property
    def k1(self) -> float:
        """Term-frequency saturation."""
        return float(self._model.k1)

    @property
    def b(self) -> float:
        """Document-length normalisation."""
        return float(self._model.b)

    @classmethod
    def build(
        cls,
        ids: Sequence[str],
        texts: Sequence[str],
        tokenizer: Tokenizer,
        k1: float = 1.5,
        b: float = 0.75,
        prune_min_df: int = PRUNE_MIN_DF,
    ) -> BM25Retriever:
        """Tokenize ``texts`` and index them (row i is ``ids[i]``)."""
        check_ids(ids, len(texts), "bm25 build")
        if not texts:
            raise CorpusError("cannot build a BM25 index over 0 documents")
        # An unseen term gets the next id from the counter on first lookup; mapping with the
        # dict's own __getitem__ keeps the per-token loop in C (25M tokens at 100K chunks).
        vocab: defaultdict[str, int] = defaultdict(itertools.count().__next__)
        corpus_token_ids = [list(map(vocab.__getitem__, tokenizer.tokenize(t))) for t in texts]
        if not vocab:
            raise CorpusError(f"no {tokenizer.name} terms in any of the {len(texts)} documents")
        model = bm25s.BM25(k1=k1, b=b, method="lucene")
        model.index((corpus_token_ids, dict(vocab)), create_empty_token=False, show_progress=False)
        return cls(ids, model, tokenizer, prune_min_df)

    def _query_terms(self, query: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(term id, count in query) of the known terms: (short posting lists, long ones)."""
        short: list[tuple[int, int]] = []
        long: list[tuple[int, int]] = []
        for term, count in Counter(self.tokenizer.tokenize_query(query)).items():
            term_id = self._vocab.get(term)
            if term_id is None:
                continue
            df = self._indptr[term_id + 1] - self._indptr[term_id]
            (long if df >= self.prune_min_df else short).append((term_id, count))
        return short, long

    def _add(self, scores: NDArray[np.float32], terms: list[tuple[int, int]]) -> None:
        """Add each term's column (times its query count) into a full-length score array."""
        for term_id, count in terms:
            start, end = self._indptr[term_id], self._indptr[term_id + 1]
            # np.add.at (unbuffered) has a fast path for 1-D float arrays since numpy 1.25:
            # measured 2.0 ms vs 3.7 ms for `scores[idx] += data` on 100K-chunk queries.
            data = self._data[start:end]
            np.add.at(scores, self._indices[start:end], data if count == 1 else count * data)

    def scores(self, query: str) -> NDArray[np.float32]:
        """BM25 score of every document for ``query`` (row order), zeros when no term matches."""
        short, long = self._query_terms(query)
        scores = np.zeros(len(self.ids), dtype=np.float32)
        self._add(scores, short + long)
        return scores

    def _split_long(
        self, partial: NDArray[np.float32], long: list[tuple[int, int]], k: int
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]], float]:
        """(essential, skipped, bound): the long terms to add in full, and those whose summed
        upper bound stays below the k-th best ``partial`` score (MaxScore's non-essential set)."""
        matched = np.flatnonzero(partial > 0)
        if len(matched) < k or not long:
            return long, [], 0.0
        theta = float(np.partition(partial[matched], len(matched) - k)[len(matched) - k])
        by_bound = sorted(long, key=lambda t: t[1] * float(self._max_impact[t[0]]))
        bound = 0.0
        for n_skipped, (term_id, count) in enumerate(by_bound):
            upper = count * float(self._max_impact[term_id])
            if bound + upper >= SKIP_BOUND_FRACTION * theta:
                return by_bound[n_skipped:], by_bound[:n_skipped], bound
            bound += upper
        return [], by_bound, bound

    def _top_with_lookups(
        self, partial: NDArray[np.float32], skipped: list[tuple[int, int]], bound: float, k: int
    ) -> tuple[NDArray[np.intp], NDArray[np.float32]]:
        """Exact top k when the ``skipped`` terms add at most ``bound`` to any document."""
        matched = np.flatnonzero(partial > 0)
        theta = np.partition(partial[matched], len(matched) - k)[len(matched) - k]
        # k documents already reach theta; every other one ends below it unless its partial
        # score is within `bound` of theta, so only those few need the skipped terms.
        docs = matched[partial[matched] >= theta - bound]
        final = partial[docs]
        for term_id, count in skipped:
            start, end = self._indptr[term_id], self._indptr[term_id + 1]
            column = self._indices[start:end]
            pos = np.minimum(np.searchsorted(column, docs), len(column) - 1)
            found = column[pos] == docs
            final[found] += count * self._data[start:end][pos[found]]
        return top_k(docs, final, k)

    def search(self, query: str, k: int) -> list[Hit]:
        """The ``k`` best documents with a positive score (fewer if fewer match)."""
        check_k(k)
        short, long = self._query_terms(query)
        scores = np.zeros(len(self.ids), dtype=np.float32)
        self._add(scores, short)
        essential, skipped, bound = self._split_long(scores, long, k)
        self._add(scores, essential)
        if skipped:
            docs, best = self._top_with_lookups(scores, skipped, bound, k)
        else:
            matched = np.flatnonzero(scores > 0)
            docs, best = top_k(matched, scores[matched], k)
        return [
            Hit(self.ids[d], s, rank)
            for rank, (d, s) in enumerate(zip(docs.tolist(), best.tolist(), strict=True), 1)
        ]

    def save(self, directory: Path) -> None:
        """Write the bm25s matrix files and ``bm25.meta.json`` into an existing directory."""
        if not directory.is_dir():
            raise ConfigError(f"index directory {str(directory)!r} does not exist")
        self._model.save(directory, show_progress=False, **BM25S_FILES)
        meta = Bm25Meta.written_now(self.tokenizer.name, self.k1, self.b, list(self.ids))
        (directory / META_FILE).write_bytes(orjson.dumps(meta.model_dump()))

    @classmethod
    def load(
        cls,
        directory: Path,
        tokenizer: Tokenizer,
        mmap: bool = False,
        prune_min_df: int = PRUNE_MIN_DF,
    ) -> BM25Retriever:
        """Read an index written by `save`; refuse one built with another tokenizer."""
        meta = read_meta(directory, META_FILE, Bm25Meta, "BM25")
        check_query_side(
            directory, "BM25", "tokenizer", meta.tokenizer, meta.normalization, tokenizer.name
        )
        model = bm25s.BM25.load(directory, mmap=mmap, show_progress=False, **BM25S_FILES)
        return cls(meta.ids, model, tokenizer, prune_min_df)
