"""Section drafts: what every format reader hands the loader, and the heading walk they share.

A reader turns one file into `Draft`s (id, where it starts, heading path, body text, and for PDFs
the page it starts on with the offsets where later pages begin). `DraftBuilder` is the walk over
a document's headings and body text that Markdown, PDF, HTML and DOCX readers all feed, so ids,
titles and the empty-heading rule are the same whatever the format:

- id ``<stem>#<anchor>``: an explicit anchor, else `slugify` of the heading; a repeated slug in one
  file gets -2, -3, ...; text before the first heading is ``#_preamble``;
- title: the path of enclosing headings joined with ' > ';
- a heading with an empty body (a title followed directly by a subheading) yields no section.
"""

from __future__ import annotations

import datetime as dt
import re
import unicodedata
from dataclasses import dataclass, field

PREAMBLE_ANCHOR = "_preamble"


@dataclass(frozen=True, slots=True)
class Draft:
    """One section as a reader found it (the loader adds order and token counts)."""

    id: str
    line: int
    title: str
    text: str
    date: dt.date | None = None
    tags: tuple[str, ...] = ()
    source: str | None = None
    page: int | None = None  # PDF: 1-based page where the section starts
    page_breaks: tuple[int, ...] = ()  # offsets in `text` where page+1, page+2, ... begin


def slugify(text: str) -> str:
    """NFKC, lowercase, whitespace runs to '-', punctuation dropped, CJK kept; '' -> 'section'.

    >>> slugify("灯器の日常点検（月例）")
    '灯器の日常点検月例'
    >>> slugify("Step 2: Replace the LAMP!")
    'step-2-replace-the-lamp'
    """
    out: list[str] = []
    for ch in unicodedata.normalize("NFKC", text).lower().strip():
        if ch.isspace() or ch == "-":
            out.append("-")
        elif ch == "_" or unicodedata.category(ch)[0] in "LNM":
            out.append(ch)
    return re.sub(r"-{2,}", "-", "".join(out)).strip("-") or "section"


@dataclass(slots=True)
class DraftBuilder:
    """Collects one file's sections from heading and body events, in document order."""

    stem: str
    date: dt.date | None = None
    tags: tuple[str, ...] = ()
    drafts: list[Draft] = field(default_factory=list)
    _used: set[str] = field(default_factory=set)
    _path: list[tuple[int, str]] = field(default_factory=list)
    _anchor: str = PREAMBLE_ANCHOR
    _title: str = ""
    _line: int = 1
    _parts: list[str] = field(default_factory=list)
    _page: int | None = None
    _breaks: list[int] = field(default_factory=list)
    _page_now: int | None = None
    _length: int = 0

    def begin_at(self, line: int) -> None:
        """The text before the first heading starts at `line` (after front matter)."""
        self._line = line

    def title_preamble(self, title: str) -> None:
        """The document's own title (front matter) titles the text before the first heading."""
        if not self._path:
            self._title = title

    def heading(
        self, level: int, text: str, line: int, anchor: str | None = None, page: int | None = None
    ) -> None:
        """A heading of `level` (1 = top) starts a new section at `line` (and `page`)."""
        self._flush()
        slug = anchor or slugify(text)
        if slug in self._used:  # a repeated or colliding id: a stable suffix, the section kept
            n = 2
            while f"{slug}-{n}" in self._used:
                n += 1
            slug = f"{slug}-{n}"
        self._used.add(slug)
        while self._path and self._path[-1][0] >= level:
            self._path.pop()
        self._path.append((level, text))
        self._anchor, self._line = slug, line
        self._title = " > ".join(h for _, h in self._path if h)
        self._page = self._page_now = page

    def body(self, text: str, page: int | None = None, sep: str = "\n") -> None:
        """Body text of the current section (`sep` joins it to the text before)."""
        if not self._parts:
            text = text.lstrip()
            if not text:
                return
            if self._page is None:
                self._page = page
            self._page_now = self._page if self._page is not None else page
        else:
            text = sep + text
        if page is not None and self._page_now is not None and page > self._page_now:
            self._breaks.append(self._length + len(sep))
            self._page_now = page
        self._parts.append(text)
        self._length += len(text)

    def finish(self) -> list[Draft]:
        """The drafts, once the last section is closed."""
        self._flush()
        return self.drafts

    def _flush(self) -> None:
        text = "".join(self._parts).rstrip()
        if text.strip():
            breaks = tuple(b for b in self._breaks if b < len(text))
            self.drafts.append(
                Draft(
                    f"{self.stem}#{self._anchor}",
                    self._line,
                    self._title,
                    text,
                    self.date,
                    self.tags,
                    page=self._page,
                    page_breaks=breaks,
                )
            )
        self._parts, self._breaks, self._length = [], [], 0
        self._page = self._page_now = None
