"""Building a BM25 index in bounded memory: the files `BM25Retriever.build(...).save(...)`
writes, byte for byte, from documents added one at a time.

`BM25Retriever.build` hands bm25s every document's token ids at once: at 20 MB of mixed
English / Japanese text that is ~60 M Python ints in lists plus bm25s's COO arrays and its
argsort, ~430 MB above the rest of the build. Here each added document is reduced at once to its
distinct term ids and their counts (what the score matrix holds), appended to two spill files
(8 bytes per (document, term) pair); the process keeps only the vocabulary and two numbers per
document. `write` then computes bm25s's lucene scores (same float64 arithmetic, same float32
rounding: `bm25s.scoring._build_scores_and_indices_for_matrix`) and writes the CSC matrix
column block by column block, each block's postings gathered from the spill files in
document order, so every column is sorted by document as bm25s's ``_np_csc_python`` sorts it.
"""

from __future__ import annotations

import itertools
import json
import math
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.typing import NDArray

from residency.errors import CorpusError
from residency.retrieval.bm25s_cpu import bm25s
from residency.retrieval.sparse import BM25S_FILES, META_FILE, Bm25Meta
from residency.retrieval.stored import npy_header, write_meta_with_ids
from residency.retrieval.tokenize_ja import Tokenizer

FLUSH_PAIRS = 1 << 20  # (term, count) pairs buffered before they go to the spill files
PIECE_PAIRS = 1 << 20  # pairs read back from the spill files at a time
BLOCK_PAIRS = 1 << 23  # postings of one column block (8 bytes each in the output buffers)
_TERMS, _COUNTS = "bm25-terms.i32", "bm25-counts.i32"


class Bm25Writer:
    """Documents in, bm25s's lucene index files out (row i is the i-th document added)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        spill_dir: Path,
        k1: float = 1.5,
        b: float = 0.75,
        *,
        flush_pairs: int = FLUSH_PAIRS,
        piece_pairs: int = PIECE_PAIRS,
        block_pairs: int = BLOCK_PAIRS,
    ) -> None:
        self.tokenizer, self.k1, self.b = tokenizer, k1, b
        self._spill_dir = spill_dir
        self._flush_pairs, self._piece_pairs, self._block_pairs = (
            flush_pairs,
            piece_pairs,
            block_pairs,
        )
        # First-seen numbering, as `BM25Retriever.build` numbers terms.
        self._vocab: defaultdict[str, int] = defaultdict(itertools.count().__next__)
        self._lengths = array("q")  # tokens per document (bm25s's |d|)
        self._distinct = array("q")  # distinct terms per document
        self._terms, self._counts = array("i"), array("i")
        self._files: tuple[BinaryIO, BinaryIO] | None = (
            (spill_dir / _TERMS).open("wb"),
            (spill_dir / _COUNTS).open("wb"),
        )

    @property
    def documents(self) -> int:
        """Documents added so far."""
        return len(self._lengths)

    def add(self, text: str) -> None:
        """Tokenize one document and keep its distinct terms and their counts."""
        ids = list(map(self._vocab.__getitem__, self.tokenizer.tokenize(text)))
        counts = Counter(ids)
        self._lengths.append(len(ids))
        self._distinct.append(len(counts))
        self._terms.extend(counts.keys())
        self._counts.extend(counts.values())
        if len(self._terms) >= self._flush_pairs:
            self._flush()

    def _flush(self) -> None:
        if self._files is None:
            raise RuntimeError("Bm25Writer.write was already called")
        self._terms.tofile(self._files[0])
        self._counts.tofile(self._files[1])
        self._terms, self._counts = array("i"), array("i")

    def _close_spill(self) -> None:
        if self._files is not None:
            self._flush()
            for f in self._files:
                f.close()
            self._files = None

    def write(self, directory: Path, ids_file: Path) -> None:
        """Write the bm25s files and ``bm25.meta.json`` (ids read from `ids_file`, one JSON
        string per line, one per document) into the existing `directory`; remove the spill."""
        self._close_spill()
        try:
            self._write(directory, ids_file)
        finally:
            for name in (_TERMS, _COUNTS):
                (self._spill_dir / name).unlink(missing_ok=True)

    def _write(self, directory: Path, ids_file: Path) -> None:
        n_docs, vocab = len(self._lengths), dict(self._vocab)
        if not n_docs:
            raise CorpusError("cannot build a BM25 index over 0 documents")
        if not vocab:
            raise CorpusError(f"no {self.tokenizer.name} terms in any of the {n_docs} documents")
        lengths = np.frombuffer(self._lengths, dtype=np.int64)
        doc_ptr = np.zeros(n_docs + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(self._distinct, dtype=np.int64), out=doc_ptr[1:])
        df = np.zeros(len(vocab), dtype=np.int64)
        for terms, _, _ in self._spilled(0, len(vocab)):
            df += np.bincount(terms, minlength=len(vocab))
        # bm25s: idf per term with math.log on Python numbers (numpy's log may round otherwise).
        idf = np.array(
            [math.log(1 + (n_docs - d + 0.5) / (d + 0.5)) for d in df.tolist()], dtype=np.float32
        )
        # bm25s: k1 * ((1 - b) + b * l_d / l_avg), l_avg the float64 mean of the lengths.
        norm = self.k1 * ((1 - self.b) + self.b * lengths / lengths.mean())
        indptr = np.zeros(len(vocab) + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        nnz = int(indptr[-1])
        names = BM25S_FILES
        with (
            (directory / names["data_name"]).open("wb") as data_out,
            (directory / names["indices_name"]).open("wb") as rows_out,
        ):
            data_out.write(npy_header(np.dtype(np.float32), (nnz,)))
            rows_out.write(npy_header(np.dtype(np.int32), (nnz,)))
            for c0, c1 in column_blocks(indptr, self._block_pairs):
                data, rows = self._block(c0, c1, indptr, doc_ptr, idf, norm)
                data.tofile(data_out)
                rows.tofile(rows_out)
        np.save(directory / names["indptr_name"], indptr)
        self._write_params(directory, vocab, n_docs)
        meta = Bm25Meta.written_now(self.tokenizer.name, self.k1, self.b, ["-"])
        write_meta_with_ids(directory / META_FILE, meta, ids_file)

    def _spilled(
        self, c0: int, c1: int
    ) -> Iterator[tuple[NDArray[np.int32], NDArray[np.int32], NDArray[np.intp]]]:
        """(term ids, counts, pair indices) of the spilled pairs whose term is in [c0, c1),
        read ``piece_pairs`` pairs at a time, in document order."""
        total = (self._spill_dir / _TERMS).stat().st_size // 4
        with (
            (self._spill_dir / _TERMS).open("rb") as term_file,
            (self._spill_dir / _COUNTS).open("rb") as count_file,
        ):
            for first in range(0, total, self._piece_pairs):
                terms = np.fromfile(term_file, dtype=np.int32, count=self._piece_pairs)
                counts = np.fromfile(count_file, dtype=np.int32, count=self._piece_pairs)
                keep = np.flatnonzero((terms >= c0) & (terms < c1))
                if len(keep):
                    yield terms[keep], counts[keep], keep + first

    def _block(
        self,
        c0: int,
        c1: int,
        indptr: NDArray[np.int64],
        doc_ptr: NDArray[np.int64],
        idf: NDArray[np.float32],
        norm: NDArray[np.float64],
    ) -> tuple[NDArray[np.float32], NDArray[np.int32]]:
        """Scores and document rows of columns [c0, c1), column by column, rows ascending."""
        size = int(indptr[c1] - indptr[c0])
        data = np.empty(size, dtype=np.float32)
        rows_out = np.empty(size, dtype=np.int32)
        heads = indptr[c0:c1] - indptr[c0]  # next free slot of each column in the block
        for terms, counts, where in self._spilled(c0, c1):
            rows = np.searchsorted(doc_ptr, where, side="right") - 1
            tf = counts.astype(np.float64)
            scores = (idf[terms].astype(np.float64) * (tf / (norm[rows] + tf))).astype(np.float32)
            order = np.argsort(terms, kind="stable")  # keeps document order within a column
            cols = terms[order]
            starts = np.flatnonzero(np.r_[True, cols[1:] != cols[:-1]])
            run = np.diff(np.r_[starts, len(cols)])
            slot = heads[cols - c0] + (np.arange(len(cols)) - np.repeat(starts, run))
            data[slot] = scores[order]
            rows_out[slot] = rows[order]
            heads[cols[starts] - c0] += run
        return data, rows_out

    def _write_params(self, directory: Path, vocab: dict[str, int], n_docs: int) -> None:
        """bm25s's vocab and params files, written as `bm25s.BM25.save` writes them."""
        model = bm25s.BM25(k1=self.k1, b=self.b, method="lucene")
        with (directory / BM25S_FILES["vocab_name"]).open("wt", encoding="utf-8") as f:
            f.write(bm25s.utils.json_functions.dumps(vocab, ensure_ascii=False))
        params = dict(
            k1=model.k1,
            b=model.b,
            delta=model.delta,
            method=model.method,
            idf_method=model.idf_method,
            dtype=model.dtype,
            int_dtype=model.int_dtype,
            num_docs=n_docs,
            version=bm25s.__version__,
            backend=model.backend,
        )
        with (directory / BM25S_FILES["params_name"]).open("w") as f:
            json.dump(params, f, indent=4)


def column_blocks(indptr: NDArray[np.int64], block_pairs: int) -> list[tuple[int, int]]:
    """[c0, c1) ranges of consecutive columns holding at most `block_pairs` postings each (a
    column longer than that is a block of its own).

    >>> column_blocks(np.array([0, 2, 5, 6, 12]), 4)
    [(0, 1), (1, 3), (3, 4)]
    """
    n_cols = len(indptr) - 1
    blocks: list[tuple[int, int]] = []
    c0 = 0
    while c0 < n_cols:
        c1 = int(np.searchsorted(indptr, indptr[c0] + block_pairs, side="right")) - 1
        c1 = min(max(c1, c0 + 1), n_cols)
        blocks.append((c0, c1))
        c0 = c1
    return blocks
