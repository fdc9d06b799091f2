"""Japanese-aware sentence splitting that keeps each delimiter with its sentence and its offsets.

A sentence ends after 。！？ (and their ASCII / half-width forms !?｡), with any closing brackets
or quotes that follow (「…。」 stays one sentence), or at a newline. Spans cover the text without
gaps, so joining them gives the text back and chunk offsets map into the original.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ENDERS = "。！？!?｡"
_CLOSERS = "」』）)】〕〉》\"'”’］]"
_SENTENCE_END = re.compile(rf"[{_ENDERS}]+[{re.escape(_CLOSERS)}]*|\n+")


@dataclass(frozen=True, slots=True)
class Span:
    """[start, end) of a piece of a text."""

    start: int
    end: int

    @property
    def length(self) -> int:
        """end - start."""
        return self.end - self.start


def split_sentences(text: str) -> list[Span]:
    """Sentence spans of `text`, delimiters kept; whitespace-only pieces join the previous one.

    >>> t = "灯器を点検する。「異常なし」と記録！\\n次へ"
    >>> [t[s.start:s.end] for s in split_sentences(t)]
    ['灯器を点検する。', '「異常なし」と記録！\\n', '次へ']
    """
    spans: list[Span] = []
    start = 0
    for m in _SENTENCE_END.finditer(text):
        end = m.end()
        # A newline right after 。 belongs to that sentence: extend over trailing newlines.
        while end < len(text) and text[end] == "\n":
            end += 1
        if end <= start:
            continue
        _append(spans, text, Span(start, end))
        start = end
    if start < len(text):
        _append(spans, text, Span(start, len(text)))
    return spans


def _append(spans: list[Span], text: str, span: Span) -> None:
    if spans and not text[span.start : span.end].strip():
        spans[-1] = Span(spans[-1].start, span.end)
    else:
        spans.append(span)


def split_long(spans: list[Span], max_chars: int, piece_chars: int) -> list[Span]:
    """Spans longer than `max_chars` cut into pieces of `piece_chars` (a run-on sentence)."""
    out: list[Span] = []
    for s in spans:
        if s.length <= max_chars:
            out.append(s)
            continue
        for start in range(s.start, s.end, piece_chars):
            out.append(Span(start, min(start + piece_chars, s.end)))
    return out
