"""BM25 tokenizers for Japanese text, named so the index manifest can refuse a mismatch.

The default, `CjkBigramTokenizer`, needs no dictionary: measured on JSQuAD v1.3 valid
(docs/design/retrieval.md) NFKC + character uni+bigrams reaches MRR@10 .935, above Sudachi C
normalised forms (~.925), while bm25s's own whitespace tokenizer turns a whole Japanese sentence
into one token (.250).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Protocol

from residency.errors import ConfigError
from residency.normalize import normalize_text

# Unicode blocks, after NFKC (which folds half-width katakana into this range):
#   3005-3007 々〆〇, 3041-309F hiragana (incl. ゝゞ), 30A1-30FA katakana + ヷ..ヺ,
#   30FC-30FF ー (prolonged sound mark) ヽヾヿ (30A0 ゠ and 30FB ・ are punctuation: dropped),
#   31F0-31FF small katakana, 3400-4DBF ext. A, 4E00-9FFF unified ideographs,
#   F900-FAFF compatibility ideographs, 20000-3134F ext. B..G.
_CJK_CHARS = (
    "\u3005-\u3007\u3041-\u309f\u30a1-\u30fa\u30fc-\u30ff\u31f0-\u31ff"
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
)
# A CJK run, or a run of other letters/digits (Latin, digits, Greek, Hangul...): word chars
# minus "_" minus the CJK set. Everything else (punctuation, symbols, spaces) separates.
_RUNS = re.compile(f"([{_CJK_CHARS}]+)|([^\\W_{_CJK_CHARS}]+)")
# In a query that also has CJK text, each other word (UNTAG, ASTM, GPU, 2024) counts this many
# times. A CJK word of n characters gives 2n - 1 terms (3 for the common two-character word), a
# Latin word one, so "UNTAGの正式名称は" was ranked by 正式名称's seven terms and the paragraph
# that names UNTAG fell out of the top 40. Measured on JSQuAD v1.3 valid (4,442 questions,
# docs/design/retrieval.md): section R@1 .8823 -> .8922, MRR@10 .9131 -> .9210 at weight 3
# (.9216 at 4, .9227 at 6 with R@40 lower). The index side is unchanged, so indexes stay valid.
QUERY_WORD_WEIGHT = 3


class Tokenizer(Protocol):
    """Text to BM25 terms; ``name`` is recorded in the index manifest."""

    name: str

    def tokenize(self, text: str) -> list[str]:
        """The terms of ``text`` in order, duplicates kept (they are term frequencies)."""
        ...

    def tokenize_query(self, text: str) -> list[str]:
        """A query's terms, a term repeated as often as it should count in the score."""
        ...


class CjkBigramTokenizer:
    """NFKC text; CJK runs -> character unigrams + bigrams, other word runs -> lower-cased words.

    >>> CjkBigramTokenizer().tokenize("東京タワーはGPU-4台。")
    ['東', '京', 'タ', 'ワ', 'ー', 'は', '東京', '京タ', 'タワ', 'ワー', 'ーは', 'gpu', '4', '台']
    """

    name = "cjk-bigram-v1"

    def __init__(self, query_word_weight: int = QUERY_WORD_WEIGHT) -> None:
        if query_word_weight < 1:
            raise ValueError(f"query_word_weight must be >= 1, got {query_word_weight}")
        self.query_word_weight = query_word_weight

    def tokenize(self, text: str) -> list[str]:
        """Each CJK run's unigrams then bigrams; lower-cased words elsewhere; no punctuation."""
        return _terms(_RUNS.findall(normalize_text(text)), 1)

    def tokenize_query(self, text: str) -> list[str]:
        """`tokenize`, with each non-CJK word repeated ``query_word_weight`` times when the query
        also has CJK text (an all-Latin query is unchanged: weighting every term alike ranks
        the same).

        >>> CjkBigramTokenizer().tokenize_query("UNTAGの正式名称")
        ['untag', 'untag', 'untag', 'の', '正', '式', '名', '称', 'の正', '正式', '式名', '名称']
        """
        runs = _RUNS.findall(normalize_text(text))
        return _terms(runs, self.query_word_weight if any(cjk for cjk, _ in runs) else 1)


def _terms(runs: list[tuple[str, str]], word_weight: int) -> list[str]:
    """Each CJK run's unigrams then bigrams; each other word lower-cased, `word_weight` times."""
    tokens: list[str] = []
    for cjk, word in runs:
        if cjk:
            tokens.extend(cjk)
            tokens.extend(map(str.__add__, cjk[:-1], cjk[1:]))
        else:
            tokens.extend([word.lower()] * word_weight)
    return tokens


SUDACHI_INSTALL = "pip install 'residency[sudachi]'"


class SudachiTokenizer:
    """SudachiPy mode C normalised forms (e.g. 附属 -> 付属), punctuation and spaces dropped."""

    name = "sudachi-c-normalized-v1"

    def __init__(self) -> None:
        try:
            from sudachipy import Dictionary, SplitMode
        except ImportError as exc:
            raise ConfigError(
                f"tokenizer {self.name!r} needs SudachiPy and its core dictionary; "
                f"install them with: {SUDACHI_INSTALL}"
            ) from exc
        self._tokenizer: Any = Dictionary().create()
        self._mode: Any = SplitMode.C

    def tokenize(self, text: str) -> list[str]:
        """Mode-C normalised forms, lower-cased; 補助記号 (punctuation) and 空白 dropped."""
        tokens: list[str] = []
        for morpheme in self._tokenizer.tokenize(normalize_text(text), self._mode):
            if morpheme.part_of_speech()[0] in ("補助記号", "空白"):
                continue
            form = morpheme.normalized_form().lower()
            if form.strip():
                tokens.append(form)
        return tokens

    def tokenize_query(self, text: str) -> list[str]:
        """`tokenize`: Sudachi cuts words, so a Latin word and a Japanese word are one term each."""
        return self.tokenize(text)


_TOKENIZERS: dict[str, Callable[[], Tokenizer]] = {
    CjkBigramTokenizer.name: CjkBigramTokenizer,
    SudachiTokenizer.name: SudachiTokenizer,
}
KNOWN_TOKENIZERS: tuple[str, ...] = tuple(_TOKENIZERS)


def get_tokenizer(name: str) -> Tokenizer:
    """The tokenizer recorded under ``name`` in an index manifest; ConfigError if unknown."""
    try:
        factory = _TOKENIZERS[name]
    except KeyError:
        raise ConfigError(
            f"unknown tokenizer {name!r}; known tokenizers: {', '.join(KNOWN_TOKENIZERS)}"
        ) from None
    return factory()
