"""The corpus records: sections (the unit of residency and of evidence) and their chunks.

A `Section` is what the planner keeps resident or leaves to retrieval: a markdown heading's
body, a paragraph of a .txt file or one .jsonl record. A `Chunk` is a slice of one section's
text, the unit the retrievers index; chunks never cross sections, so every chunk hit maps to
exactly one section (`Chunk.section_id`), and `collapse_to_sections` turns chunk hits into
section-level `SectionHit`s.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from residency.corpus.drafts import PREAMBLE_ANCHOR
from residency.normalize import normalize_text

_ID = 1024  # the longest id accepted: a deep path plus a long anchor
_TEXT = 10_000_000
MAX_SECTION_CHARS = _TEXT  # one section's text; a longer one is skipped (loader.py)
# files whose section ids end in the heading's own anchor ("#install"), cited with it
ANCHORED_SUFFIXES = (".md", ".markdown", ".html", ".htm")


class Section(BaseModel):
    """One section of the corpus, with its text as written and its token count."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    id: str = Field(
        min_length=1,
        max_length=_ID,
        description="Stable id: 'manual/operations#lamp-daily-check', 'notes/log#p3' or the "
        ".jsonl record's own id. Unchanged while the file's headings / order are unchanged.",
    )
    file: str = Field(
        min_length=1, max_length=_ID, description="Source file, relative to the corpus root (/)."
    )
    line: int = Field(
        ge=1,
        description="Where the section starts: 1-based line (.md, .txt, .jsonl, HTML block), "
        "page (PDF) or paragraph (DOCX).",
    )
    title: str = Field(
        max_length=_ID,
        description="Heading path ('運用マニュアル > 灯器の日常点検'), the record's title, or ''.",
    )
    text: str = Field(
        min_length=1, max_length=_TEXT, description="The body as written (not normalised)."
    )
    date: dt.date | None = Field(default=None, description="Date of a dated note (.jsonl 'date').")
    tags: tuple[str, ...] = Field(default=(), max_length=256, description="Record tags.")
    source: str | None = Field(
        default=None, max_length=_ID, description="The .jsonl record's 'source' field."
    )
    page: int | None = Field(
        default=None, ge=1, description="PDF: the 1-based page the section starts on (citations)."
    )
    page_breaks: tuple[int, ...] = Field(
        default=(),
        max_length=100_000,
        description="PDF: offsets in `text` where the next pages begin (page+1, page+2, ...).",
    )
    order: int = Field(
        ge=0, description="Corpus order: files sorted by relative path, sections in file order."
    )
    token_count: int = Field(
        ge=0, description="Tokens of `text` alone (see the manifest's token_count for how)."
    )

    def page_at(self, offset: int) -> int | None:
        """The PDF page holding character `offset` of the text (None: not from a PDF).

        Page 3 with breaks (120, 480): offset 200 is on page 4."""
        if self.page is None:
            return None
        return self.page + bisect_right(self.page_breaks, offset)

    def cite(self, start: int = 0, end: int | None = None) -> str:
        """Where a reader opens the text in ``text[start:end]`` (default: to the end).

        - PDF: the page(s) the text itself is on, not where its section starts: 'manual.pdf
          p. 4', or 'manual.pdf pp. 4-5' for a passage over a page break (leading and trailing
          whitespace ignored, so a chunk starting at a break cites the next page only);
        - HTML / Markdown: the heading's anchor, 'guide/setup.md#install' ('guide/setup.md'
          for the text before the first heading);
        - .jsonl / .txt: 'notes/log.jsonl:12'; DOCX: the file.
        """
        stop = len(self.text) if end is None else min(end, len(self.text))
        if self.page is not None:
            first, last = _ink_bounds(self.text, start, stop)
            pages = (self.page_at(first), self.page_at(last))
            if pages[0] == pages[1]:
                return f"{self.file} p. {pages[0]}"
            return f"{self.file} pp. {pages[0]}-{pages[1]}"
        if self.file.endswith((".jsonl", ".txt")):
            return f"{self.file}:{self.line}"
        if self.file.lower().endswith(ANCHORED_SUFFIXES):
            anchor = self.id.rpartition("#")[2]
            return self.file if anchor in ("", PREAMBLE_ANCHOR) else f"{self.file}#{anchor}"
        return self.file


def _ink_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    """Offsets of the first and last non-space characters of text[start:end] ((start, start)
    for blank text)."""
    first = start
    while first < end and text[first].isspace():
        first += 1
    last = end - 1
    while last > first and text[last].isspace():
        last -= 1
    return (first, max(first, last)) if first < end else (start, start)


class Chunk(BaseModel):
    """A slice of one section's text: what BM25 and the dense index hold."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    id: str = Field(
        min_length=4, max_length=_ID + 16, description="'<section id>::c<N>', N from 1."
    )
    section_id: str = Field(min_length=1, max_length=_ID, description="The section it slices.")
    order: int = Field(ge=0, description="Position in the index (corpus order).")
    start_char: int = Field(ge=0, description="Start offset in the section's text.")
    end_char: int = Field(ge=1, description="End offset (exclusive) in the section's text.")
    text: str = Field(min_length=1, max_length=_TEXT, description="section.text[start:end].")
    index_text: str = Field(
        min_length=1,
        max_length=_TEXT + _ID,
        description="What the retrievers index: the section title, a newline, then `text` "
        "(the title gives every chunk its heading's context).",
    )
    content_hash: str = Field(
        min_length=64,
        max_length=64,
        description="sha256 of normalize_text(index_text): the key of its reusable vector.",
    )


def chunk_index_text(title: str, text: str) -> str:
    """The text a chunk is indexed under: its section's title line, then the chunk text."""
    return f"{title}\n{text}" if title else text


def content_hash(index_text: str) -> str:
    """sha256 hex of the normalised index text (what the embedder sees, so equal text = equal
    vector)."""
    return hashlib.sha256(normalize_text(index_text).encode("utf-8")).hexdigest()


def chunk_id(section_id: str, n: int) -> str:
    """'<section id>::c<n>' (n from 1)."""
    return f"{section_id}::c{n}"


def section_id_of(chunk_id_: str) -> str:
    """The section id a chunk id belongs to: everything before the last '::c'."""
    head, sep, _ = chunk_id_.rpartition("::c")
    return head if sep else chunk_id_


class SkippedInput(BaseModel):
    """An input the loader did not index, and why (listed in the CLI output and manifest)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    file: str = Field(min_length=1, max_length=_ID, description="File relative to the corpus.")
    line: int = Field(ge=0, description="1-based line, or 0 when the whole file was skipped.")
    reason: str = Field(min_length=1, max_length=2000, description="What is wrong with it.")

    def location(self) -> str:
        """'file:line' or 'file'."""
        return f"{self.file}:{self.line}" if self.line else self.file


class SourceFile(BaseModel):
    """One file the loader looked at: its content hash and what it yielded."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    path: str = Field(min_length=1, max_length=_ID, description="Relative to the corpus root.")
    sha256: str = Field(min_length=64, max_length=64, description="sha256 of the file's bytes.")
    size_bytes: int = Field(ge=0, description="File size.")
    sections: int = Field(ge=0, description="Sections taken from it.")


@dataclass(frozen=True, slots=True)
class SectionHit:
    """A section ranked by its best chunk: 1-based rank, that chunk's score and id."""

    section_id: str
    rank: int
    score: float
    chunk_id: str


class RankedHit(Protocol):
    """A chunk-level hit of any retriever (`Hit`, `FusedHit`): an id and a score."""

    @property
    def id(self) -> str:
        """The chunk id."""
        ...

    @property
    def score(self) -> float:
        """The retriever's score."""
        ...


def collapse_to_sections(
    hits: Sequence[RankedHit], section_of: Callable[[str], str], k: int
) -> list[SectionHit]:
    """Chunk hits (best first) to the first `k` distinct sections; first occurrence = rank."""
    out: list[SectionHit] = []
    seen: set[str] = set()
    for hit in hits:
        sid = section_of(hit.id)
        if sid in seen:
            continue
        seen.add(sid)
        out.append(SectionHit(sid, len(out) + 1, hit.score, hit.id))
        if len(out) == k:
            break
    return out
