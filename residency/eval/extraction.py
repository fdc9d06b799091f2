"""How much of a document the readers keep: words kept and added against a reference text, heading
recall and precision against hand-counted headings, and characters no text should hold.

Words are compared as bags after the project's NFKC normalisation (`normalize_text`) and
lowercasing: a run of letters / digits is one word, each CJK character is one word (Japanese has
no spaces, so a run would depend on where the reader broke lines). Worked example: reference
"Foo bar bar" and indexed "bar foo baz" keep 2 of 3 reference words (0.67) and add 1 of 3
indexed words (0.33).

Headings match when their normalised text (section numbers such as "1.2" and trailing ':' / '¶'
dropped) is equal or similar (difflib ratio >= `HEADING_MATCH_RATIO`), each at most once, in
document order.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from residency.corpus.model import Section, SkippedInput
from residency.eval.real_documents import DocumentFormat, RealDocument
from residency.normalize import normalize_text

HEADING_MATCH_RATIO = 0.85
FURNITURE_EDGE = 2  # lines at the top and at the bottom of a reference page that may be furniture
FURNITURE_PAGES = 3  # ... when their text (digits masked) is there on at least this many pages
_CJK = "\u2e80-\u9fff\uf900-\ufaff\u3040-\u30ff\uff66-\uff9f"
_WORD = re.compile(f"[{_CJK}]|[^\\W_{_CJK}]+")
_NUMBERING = re.compile(r"^(?:\d+(?:\.\d+)*\.?|[ivx]+\.|[a-z]\))\s+")
_TRAILER = re.compile(r"[\s:：¶#\u200b\uf0c1]+$")
# a line holding only a page number: '3', 'iv', '- 3 -', 'Page 3 of 9', '3 / 9'
_PAGE_NUMBER = re.compile(
    r"^(?:page|seite|p\.)?\s*[-–—]?\s*(?:\d{1,4}|[ivxlc]{1,7})\s*[-–—]?\s*(?:(?:of|von|/)\s*\d{1,4})?$",
    re.IGNORECASE,
)


def words(text: str) -> Counter[str]:
    """The bag of words of `text` (see the module docstring).

    >>> sorted(words("Ｆｏｏ bar, 日本語").items())
    [('bar', 1), ('foo', 1), ('日', 1), ('本', 1), ('語', 1)]
    """
    return Counter(_WORD.findall(normalize_text(text).lower()))


def without_running_furniture(reference: str) -> str:
    """A paged reference text (pages split by form feeds, as ``pdftotext`` writes them) less its
    running furniture, which the PDF reader is asked to leave out: among the `FURNITURE_EDGE`
    first and last non-blank lines of each page, from the edge inwards while they are furniture,
    those holding only a page number and those whose text (digits masked) stands there on at
    least `FURNITURE_PAGES` pages ('3', '1.1. TOPOLOGISCHE RÄUME'). Found in the reference
    alone, never from what a reader kept; a text of one page is returned as it is.

    >>> page = "CHAPTER 1\\n\\nPage {w} starts\\nand {w} ends.\\n\\n{n}"
    >>> text = "\\f".join(page.format(w=w, n=n) for n, w in [(1, "one"), (2, "two"), (3, "3")])
    >>> without_running_furniture(text).split("\\f")[2]
    '\\nPage 3 starts\\nand 3 ends.\\n'
    """
    pages = [page.splitlines() for page in reference.split("\f")]
    if len([p for p in pages if any(ln.strip() for ln in p)]) < 2:
        return reference
    seen: Counter[str] = Counter()
    for lines in pages:
        filled = [i for i, ln in enumerate(lines) if ln.strip()]
        at_edge = sorted(set(filled[:FURNITURE_EDGE] + filled[-FURNITURE_EDGE:]))
        seen.update({_masked(lines[i]) for i in at_edge})
    kept_pages = []
    for lines in pages:
        filled = [i for i, ln in enumerate(lines) if ln.strip()]
        drop: set[int] = set()
        for side in (filled[:FURNITURE_EDGE], filled[::-1][:FURNITURE_EDGE]):
            for i in side:
                text = lines[i].strip()
                if not (_PAGE_NUMBER.match(text) or seen[_masked(text)] >= FURNITURE_PAGES):
                    break
                drop.add(i)
        kept_pages.append("\n".join(ln for i, ln in enumerate(lines) if i not in drop))
    return "\f".join(kept_pages)


def _masked(line: str) -> str:
    return re.sub(r"\d+", "0", " ".join(line.split()).casefold())


def heading_key(text: str) -> str:
    """A heading's text as compared: normalised, lowercase, numbering and trailing marks gone.

    >>> heading_key("1.2 Metrische Räume")
    'metrische räume'
    >>> heading_key("Variance Analysis:")
    'variance analysis'
    """
    key = normalize_text(text).lower()
    key = _NUMBERING.sub("", key)
    return _TRAILER.sub("", key)


def _similar(a: str, b: str) -> bool:
    return a == b or SequenceMatcher(None, a, b).ratio() >= HEADING_MATCH_RATIO


def matched_headings(expected: Sequence[str], found: Sequence[str]) -> int:
    """How many expected headings have a found heading (each found heading used once)."""
    free = [heading_key(h) for h in found]
    matched = 0
    for heading in expected:
        key = heading_key(heading)
        hit = next((i for i, f in enumerate(free) if f == key), None)
        if hit is None:
            hit = next((i for i, f in enumerate(free) if f and _similar(f, key)), None)
        if hit is not None:
            free[hit] = ""
            matched += 1
    return matched


def found_headings(titles: Iterable[str]) -> list[str]:
    """Every heading the sections' titles name, in document order, each occurrence counted.

    Titles are heading paths ('A > B'); a heading with no body of its own still shows in the
    paths of the sections under it. Each section starts at a heading: the last part of its
    path is a new occurrence even when the path repeats (an invoice's 'Totals' on each of two
    pages), and so are the parts after the path it shares with the section before.

    >>> found_headings(["", "A > B", "A > C", "A", "A > C", "A > C"])
    ['A', 'B', 'C', 'A', 'C', 'C']
    """
    out: list[str] = []
    before: tuple[str, ...] = ()
    for title in titles:
        path = tuple(p for p in title.split(" > ") if p)
        if not path:
            continue
        shared = 0
        while shared < min(len(path) - 1, len(before)) and path[shared] == before[shared]:
            shared += 1
        out.extend(path[shared:])
        before = path
    return out


def bad_characters(text: str) -> int:
    """Characters no indexed text should hold: U+FFFE / U+FFFF and C0 controls but tab and
    newline (a PDF's soft-hyphen marker, proof boxes drawn with control codes)."""
    return sum(
        1
        for ch in text
        if ch in "\ufffe\uffff" or (unicodedata.category(ch) == "Cc" and ch not in "\n\t")
    )


@dataclass(frozen=True, slots=True)
class WordCounts:
    """The word and heading counts of a file or of several, against their references."""

    reference_words: int  # PDF: the reference less its running furniture
    kept_words: int
    indexed_words: int
    added_words: int
    headings_expected: int
    headings_found: int
    headings_matched: int
    bad_chars: int
    raw_reference_words: int  # the whole reference, furniture included ...
    raw_kept_words: int  # ... and how many of its words the index holds


@dataclass(frozen=True, slots=True)
class FileFigures(WordCounts):
    """What reading one benchmark file gave, against its reference."""

    path: str
    format: DocumentFormat
    expect: str
    sections: int
    skipped: tuple[str, ...]  # the reasons given for the file

    @property
    def as_expected(self) -> bool:
        """Indexed when it should be; skipped with a reason (and no section) when it should be."""
        if self.expect == "skipped":
            return self.sections == 0 and bool(self.skipped)
        return self.sections > 0


@dataclass(frozen=True, slots=True)
class Totals(WordCounts):
    """Figures summed over several files (a format, or the whole benchmark)."""

    files: int
    unexpected: int  # files not indexed / skipped as the manifest expects

    @property
    def words_kept(self) -> float:
        """Share of the reference's words found in the index (1.0 with no reference words);
        a PDF's reference less its running furniture (`without_running_furniture`)."""
        return self.kept_words / self.reference_words if self.reference_words else 1.0

    @property
    def words_kept_raw(self) -> float:
        """`words_kept` against the whole reference, running furniture included."""
        return self.raw_kept_words / self.raw_reference_words if self.raw_reference_words else 1.0

    @property
    def words_added(self) -> float:
        """Share of the indexed words that are not in the reference."""
        return self.added_words / self.indexed_words if self.indexed_words else 0.0

    @property
    def heading_recall(self) -> float:
        """Share of the hand-counted headings found as sections."""
        if not self.headings_expected:
            return 1.0
        return self.headings_matched / self.headings_expected

    @property
    def heading_precision(self) -> float:
        """Share of the sections' headings that a person sees as headings."""
        return self.headings_matched / self.headings_found if self.headings_found else 1.0


def file_figures(
    doc: RealDocument, reference: str, sections: Sequence[Section], skipped: Sequence[SkippedInput]
) -> FileFigures:
    """Compare one file's sections with its reference text and hand-counted headings; a PDF's
    words against its reference less the running furniture the reader is asked to leave out
    (the whole reference gives the raw figure)."""
    headings = found_headings(s.title for s in sections)
    indexed_text = "\n".join([*headings, *(s.text for s in sections)])
    got = words(indexed_text)
    raw = words(reference)
    ref = words(without_running_furniture(reference)) if doc.format == "pdf" else raw
    indexed = doc.expect == "indexed"
    common = sum((ref & got).values())
    return FileFigures(
        path=doc.path,
        format=doc.format,
        expect=doc.expect,
        sections=len(sections),
        skipped=tuple(s.reason for s in skipped),
        reference_words=sum(ref.values()) if indexed else 0,
        kept_words=common if indexed else 0,
        indexed_words=sum(got.values()),
        added_words=sum(got.values()) - sum((raw & got).values()),
        headings_expected=len(doc.headings),
        headings_found=len(headings),
        headings_matched=matched_headings(doc.headings, headings),
        bad_chars=sum(bad_characters(s.text) + bad_characters(s.title) for s in sections),
        raw_reference_words=sum(raw.values()) if indexed else 0,
        raw_kept_words=sum((raw & got).values()) if indexed else 0,
    )


def totals(figures: Iterable[FileFigures]) -> Totals:
    """The figures of several files summed (ratios of sums, so a long file weighs more)."""
    rows = list(figures)
    return Totals(
        files=len(rows),
        unexpected=sum(not f.as_expected for f in rows),
        reference_words=sum(f.reference_words for f in rows),
        kept_words=sum(f.kept_words for f in rows),
        indexed_words=sum(f.indexed_words for f in rows),
        added_words=sum(f.added_words for f in rows),
        headings_expected=sum(f.headings_expected for f in rows),
        headings_found=sum(f.headings_found for f in rows),
        headings_matched=sum(f.headings_matched for f in rows),
        bad_chars=sum(f.bad_chars for f in rows),
        raw_reference_words=sum(f.raw_reference_words for f in rows),
        raw_kept_words=sum(f.raw_kept_words for f in rows),
    )


def file_score(f: FileFigures) -> float:
    """One number to rank files by (lower is worse): the smallest of words kept, heading
    recall and precision, 0 for a file not read as expected or holding a bad character."""
    if not f.as_expected or f.bad_chars:
        return 0.0
    t = totals([f])
    return min(t.words_kept, t.heading_recall, t.heading_precision)


def worst_files(figures: Iterable[FileFigures], n: int = 3) -> list[FileFigures]:
    """The `n` files with the lowest `file_score`."""
    return sorted(figures, key=file_score)[:n]
