"""Cutting sections into chunks: fixed character windows with overlap, or semantic (DESIGN §7).

Chunks never cross sections (a heading always cuts) and a section no longer than the target is
one chunk. Semantic: split into sentences (`residency.corpus.sentences`), embed them, and cut
between adjacent sentences whose cosine similarity falls below the section's 25th percentile,
never before 0.5 x the target length and always before a chunk would pass 1.5 x it (a sentence
longer than that is cut into target-sized pieces first). Both chunkers only slice: a chunk's
text is exactly ``section.text[start_char:end_char]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from residency.corpus.chunker_settings import (
    DEFAULT_CHUNK_OVERLAP,
    ChunkerSettings,
)
from residency.corpus.model import Chunk, Section, chunk_id, chunk_index_text, content_hash
from residency.corpus.sentences import Span, split_long, split_sentences
from residency.errors import ConfigError
from residency.retrieval import Embedder
from residency.stats import percentile as interpolated_percentile


def check_chunker_settings(settings: ChunkerSettings) -> None:
    """Raise ConfigError for settings that contradict each other, naming the flags."""
    if settings.kind == "fixed" and settings.chunk_overlap >= settings.chunk_chars:
        raise ConfigError(
            f"--chunk-overlap {settings.chunk_overlap} must be smaller than --chunk-chars "
            f"{settings.chunk_chars} (the default overlap is {DEFAULT_CHUNK_OVERLAP})"
        )
    if settings.kind == "semantic" and settings.embedder is None:
        raise ConfigError("--chunker semantic needs an embedder for its sentences (--embedder)")


def fixed_spans(length: int, size: int, overlap: int) -> list[Span]:
    """Windows of `size` chars stepping `size - overlap`; the last ends at `length`.

    >>> [(s.start, s.end) for s in fixed_spans(600, 256, 32)]
    [(0, 256), (224, 480), (448, 600)]
    """
    spans: list[Span] = []
    start = 0
    while True:
        end = min(start + size, length)
        spans.append(Span(start, end))
        if end >= length:
            return spans
        start = end - overlap


def semantic_starts(
    lengths: Sequence[int],
    similarities: Sequence[float],
    target_chars: int,
    *,
    percentile: float = 25.0,
    min_factor: float = 0.5,
    max_factor: float = 1.5,
) -> list[int]:
    """Indices of the sentences that start a chunk (always 0), from sentence lengths and the
    cosine similarity of each adjacent pair (``similarities[i]`` between sentence i and i+1).

    Worked example, target 10 (cut allowed from 5 chars, forced past 15): lengths [4, 4, 4, 4],
    similarities [0.9, 0.1, 0.8]; the 25th percentile is 0.45: after 8 chars the 0.1 boundary
    cuts -> [0, 2].
    """
    if len(similarities) != max(len(lengths) - 1, 0):
        raise ValueError(f"{len(lengths)} sentences need {len(lengths) - 1} similarities")
    if not lengths:
        return []
    threshold = interpolated_percentile(similarities, percentile / 100) if similarities else 0.0
    min_chars, max_chars = min_factor * target_chars, max_factor * target_chars
    starts, current = [0], lengths[0]
    for i in range(1, len(lengths)):
        over = current + lengths[i] > max_chars
        if over or (current >= min_chars and similarities[i - 1] < threshold):
            starts.append(i)
            current = lengths[i]
        else:
            current += lengths[i]
    # A short tail chunk joins its predecessor when the two fit under the hard limit.
    if len(starts) > 1 and current < min_chars:
        previous = sum(lengths[starts[-2] : starts[-1]])
        if previous + current <= max_chars:
            starts.pop()
    return starts


def _semantic_sentences(section: Section, settings: ChunkerSettings) -> list[Span]:
    max_chars = int(settings.max_factor * settings.chunk_chars)
    return split_long(split_sentences(section.text), max_chars, settings.chunk_chars)


def section_spans(
    sections: Sequence[Section],
    settings: ChunkerSettings,
    embedder: Embedder | None = None,
    progress: Callable[[int], None] | None = None,
    known: Mapping[str, Sequence[Span]] | None = None,
) -> list[list[Span]]:
    """The chunk spans of each section (semantic: all long sections' sentences in one batch;
    sections in `known` keep those spans, cut by an earlier build with the same settings)."""
    check_chunker_settings(settings)
    known = known or {}
    size = settings.chunk_chars
    if settings.kind == "fixed":
        return [fixed_spans(len(s.text), size, settings.chunk_overlap) for s in sections]
    if embedder is None:
        raise ConfigError("--chunker semantic needs an embedder for its sentences (--embedder)")
    sentences = [
        _semantic_sentences(s, settings) if _to_embed(s, size, known) else [] for s in sections
    ]
    texts = [
        s.text[p.start : p.end] for s, spans in zip(sections, sentences, strict=True) for p in spans
    ]
    vectors = embedder.embed_passages(texts, progress) if texts else np.zeros((0, 1), np.float32)
    out: list[list[Span]] = []
    row = 0
    for section, spans in zip(sections, sentences, strict=True):
        if section.id in known:
            out.append(list(known[section.id]))
            continue
        if not spans:
            out.append([Span(0, len(section.text))])
            continue
        vecs = vectors[row : row + len(spans)]
        row += len(spans)
        sims = [float(x) for x in np.sum(vecs[:-1] * vecs[1:], axis=1)]
        starts = semantic_starts(
            [p.length for p in spans],
            sims,
            size,
            percentile=settings.percentile,
            min_factor=settings.min_factor,
            max_factor=settings.max_factor,
        )
        ends = [*starts[1:], len(spans)]
        out.append(
            [Span(spans[a].start, spans[b - 1].end) for a, b in zip(starts, ends, strict=True)]
        )
    return out


def chunk_sections(
    sections: Sequence[Section],
    settings: ChunkerSettings,
    embedder: Embedder | None = None,
    progress: Callable[[int], None] | None = None,
    known: Mapping[str, Sequence[Span]] | None = None,
    first_order: int = 0,
) -> list[Chunk]:
    """Chunks of every section in corpus order, ids '<section id>::c<N>' from 1; `first_order`
    is the first chunk's `order` (the chunks before it when sections come in batches)."""
    chunks: list[Chunk] = []
    all_spans = section_spans(sections, settings, embedder, progress, known)
    for section, spans in zip(sections, all_spans, strict=True):
        n = 0
        for span in spans:
            text = section.text[span.start : span.end]
            if not text.strip():
                continue
            n += 1
            index_text = chunk_index_text(section.title, text)
            chunks.append(
                Chunk(
                    id=chunk_id(section.id, n),
                    section_id=section.id,
                    order=first_order + len(chunks),
                    start_char=span.start,
                    end_char=span.end,
                    text=text,
                    index_text=index_text,
                    content_hash=content_hash(index_text),
                )
            )
    return chunks


def _to_embed(section: Section, size: int, known: Mapping[str, Sequence[Span]]) -> bool:
    return len(section.text) > size and section.id not in known


def count_sentences_to_embed(
    sections: Sequence[Section],
    settings: ChunkerSettings,
    known: Mapping[str, Sequence[Span]] | None = None,
) -> int:
    """How many sentences the semantic chunker will embed (for a progress bar's total)."""
    if settings.kind != "semantic":
        return 0
    size, known = settings.chunk_chars, known or {}
    return sum(len(_semantic_sentences(s, settings)) for s in sections if _to_embed(s, size, known))
