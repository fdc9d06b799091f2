"""Large generated corpora for the index memory benchmark: one .txt of paragraphs or one .jsonl
of records, mixed English / Japanese, written to a target size in bytes.

Seeded and streamed to disk (the generator never holds the corpus), cached under
``.cache/big-corpus/`` (gitignored) so a 200 MB corpus is generated once. Run as a script to
write one: ``python benchmarks/big_corpus.py txt 200 /tmp/corpus-200``.

Text: paragraphs of 1-8 sentences, each sentence English (words from a small Zipf vocabulary
with technical terms) or Japanese (kanji / katakana / hiragana words with particles), about
half of each; .txt paragraphs are separated by one to three blank lines (some with trailing
spaces), .jsonl records carry id, title, text and some a date and tags.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson

SEED = 20250733
MB = 1_000_000
_EN_TEXT = (
    "the of and to in is that for it as with was on be by this are at from or an have which "
    "lamp keeper harbor light beacon tide ship signal night report check storm fog boat crew "
    "cache prefix token model server budget section chunk index query resident memory block "
    "GPU vLLM KV API Python 2024 sequence window capacity engine request latency"
)
_HIRAGANA = "".join(chr(c) for c in range(0x3041, 0x3094))
_KATAKANA = "".join(chr(c) for c in range(0x30A1, 0x30F5)) + "ー"
_KANJI = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 3000))
_PARTICLES = ["の", "は", "に", "を", "が", "と", "で", "も", "から", "まで", "です", "した"]


class _Words:
    """Zipf-weighted English and Japanese vocabularies drawn from one seeded generator."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        en = _EN_TEXT.split()
        for _ in range(8_000):  # made-up English-looking words for a long tail
            en.append(
                "".join(rng.choice(list("etaoinshrdlucmfwyp"), size=int(rng.integers(3, 10))))
            )
        ja = list(_PARTICLES)
        for _ in range(20_000):
            kind = rng.random()
            alphabet = _KANJI if kind < 0.6 else _KATAKANA if kind < 0.8 else _HIRAGANA
            ja.append("".join(rng.choice(list(alphabet), size=int(rng.integers(1, 5)))))
        self.en = np.array(en, dtype=object)
        self.ja = np.array(ja, dtype=object)
        self.p_en = _zipf(len(en))
        self.p_ja = _zipf(len(ja))
        # Paragraphs combine sentences from a pool: drawing every word afresh took ~10 s of CPU
        # per MB; 60,000 sentences keep chunk texts distinct.
        self.pool = [self._sentence() for _ in range(60_000)]

    def _sentence(self) -> str:
        n = int(self.rng.integers(6, 24))
        if self.rng.random() < 0.5:
            words = self.rng.choice(self.en, size=n, p=self.p_en)
            return " ".join(words).capitalize() + "."
        return "".join(self.rng.choice(self.ja, size=n, p=self.p_ja)) + "。"

    def sentence(self) -> str:
        return self.pool[int(self.rng.integers(len(self.pool)))]

    def paragraph(self) -> str:
        picks = self.rng.integers(len(self.pool), size=int(self.rng.integers(1, 9)))
        return " ".join(self.pool[int(i)] for i in picks)


def _zipf(n: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1) ** 1.05
    return weights / weights.sum()


def _txt_blocks(words: _Words) -> Iterator[bytes]:
    while True:
        blank = "  \n" if words.rng.random() < 0.1 else "\n"
        yield (words.paragraph() + "\n" + blank * int(words.rng.integers(1, 4))).encode("utf-8")


def _jsonl_blocks(words: _Words) -> Iterator[bytes]:
    n = 0
    while True:
        n += 1
        record: dict[str, object] = {"id": f"rec-{n:07d}", "text": words.paragraph()}
        if words.rng.random() < 0.7:
            record["title"] = words.sentence()[:60]
        if words.rng.random() < 0.3:
            month, day = int(words.rng.integers(1, 13)), int(words.rng.integers(1, 29))
            record["date"] = f"2024-{month:02d}-{day:02d}"
            record["tags"] = ["log", "harbor"]
        yield orjson.dumps(record) + b"\n"


def write_corpus(kind: str, size_bytes: int, directory: Path, seed: int = SEED) -> Path:
    """Write ``directory/big.<kind>`` of about ``size_bytes`` (kind 'txt' or 'jsonl'); the
    directory, returned, holds nothing else. Reuses a file already written with these args."""
    if kind not in ("txt", "jsonl"):
        raise ValueError(f"kind must be 'txt' or 'jsonl', got {kind!r}")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"big.{kind}"
    stamp = directory.parent / f".{directory.name}.done"
    key = f"{kind} {size_bytes} {seed}"
    if target.is_file() and stamp.is_file() and stamp.read_text() == key:
        return directory
    words = _Words(np.random.default_rng(seed))
    blocks = _txt_blocks(words) if kind == "txt" else _jsonl_blocks(words)
    written = 0
    tmp = target.with_suffix(".partial")
    with tmp.open("wb") as f:
        buffer: list[bytes] = []
        for block in blocks:
            buffer.append(block)
            written += len(block)
            if len(buffer) >= 2048 or written >= size_bytes:
                f.write(b"".join(buffer))
                buffer.clear()
            if written >= size_bytes:
                break
    tmp.replace(target)
    stamp.write_text(key)
    return directory


if __name__ == "__main__":
    kind_, megabytes, out = sys.argv[1], float(sys.argv[2]), Path(sys.argv[3])
    print(write_corpus(kind_, int(megabytes * MB), out))
