"""PDF files into sections (pypdfium2, `residency[pdf]`): outline entries or larger-font lines as
headings, the page each section starts on kept for citations.

Why pypdfium2: on the shipped test PDFs it kept >= 0.99 of the characters of poppler's
``pdftotext`` (pypdf lost a third of the Japanese text of two files) at 7x pypdf's and 13x
pdfminer.six's speed (see docs/index-and-retrieval.md for the measurement).

The lines come from `pdf_layout` (clean characters, soft hyphens rejoined) less the page
furniture `pdf_furniture` finds (running headers, footers, page numbers); its contents pages'
entries are never headings; `pdf_outline` places the outline on the pages.

Headings, in order of trust:

1. The document outline (bookmarks), when at least `OUTLINE_TRUST` of its entries are found on
   their pages (a wrong outline is ignored): each entry's title is looked up on its destination
   page; the matching line becomes the heading (the outline's wording, with the section number
   the page sets before it). An entry whose text is not on its page starts its section at the
   top of that page.
2. Without an outline: lines set in a font at least `HEADING_SCALE` x the body size (the size
   most characters are set in), at most `HEADING_MAX_CHARS` long. Distinct heading sizes give the
   levels (largest = 1); consecutive heading lines of one size are one heading (a wrapped title,
   at most `HEADING_MAX_LINES` lines); a table row is never a heading.

A file that cannot be read is skipped with the reason: an encrypted PDF (decrypt it first), a PDF
without a text layer (scanned pages: OCR it first, e.g. with ocrmypdf), or a damaged file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from residency.corpus.drafts import Draft, DraftBuilder
from residency.corpus.model import SkippedInput
from residency.corpus.pdf_furniture import contents_lines, find_furniture, is_page_number
from residency.corpus.pdf_layout import Line, body_style, page_lines, rejoin_hyphens
from residency.corpus.pdf_outline import NUMBERED, Heading, outline_entries, outline_headings

if TYPE_CHECKING:
    import pypdfium2

HEADING_SCALE = 1.15  # a line this much larger than the body text is a heading candidate
HEADING_MAX_CHARS = 150  # longer lines are body text set large (a pull quote), not a heading
LABEL_MAX_CHARS = 30  # an unnumbered bold / sans line this short is a label heading ('Abstract')
CAPS_MIN_LETTERS = 4  # ... or one in capitals with this many letters ('RETURN POLICY')
LABEL_GAP = 0.04  # share of the page height between two labels that makes each a heading
SAME_SIZE = 1.0  # points: title lines this close in size are one heading and one level ...
SAME_SIZE_SHARE = 0.1  # ... or this share of the larger size (a CJK font scaled to 0.96 of 19 pt)
HEADING_MAX_LINES = 3  # a longer run of large lines is text set large (a table), not a title
WRAP_STEP = 0.06  # share of the page height from one line of a wrapped title to the next
OUTLINE_TRUST = 0.5  # share of outline entries that must be found on their pages to use it
CELLS_MAX = 2  # a line of more text runs far apart (a table row) is not a heading
_MONO = re.compile(r"Mono|TT|Courier|Code", re.IGNORECASE)
_HEAVY = re.compile(
    r"Bold|BX|Bd|Black|Heavy|Semi|Demi|Medium|Gothic|Sans|Kaku|Go(?:Pr|Std|Pro|-)", re.IGNORECASE
)
# '9,800', '$45.00', '10.20%': a line ending in an amount is a table row, never a heading
_AMOUNT = re.compile(r"^[-+]?[$€£¥]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$|^[-+]?[$€£¥]\d|^[-+]?\d[\d.,]*%$")
_LABEL_END = re.compile(r"[.。,，、;；]$")  # a sentence, not a label ('Approval:' is one)
_KEY_VALUE = re.compile(r"[:：]\s*\S")  # 'Report ID: SPARSE-2024': a field, not a label


def _number_depth(text: str) -> int:
    """1 for '2 Usage' / '§ 2 Usage' / 'A Options', 2 for '2.1 ...', 0 when not numbered (or
    the title starts in lower case)."""
    match = NUMBERED.match(text)
    if match is None or text[match.end() - 1].islower():
        return 0  # '2 oder zu einem Torus': a line of a formula, not a title
    return match.group(1).count(".") + 1


def _caps_label(text: str) -> bool:
    """'PAYMENT METHOD', 'RETURN POLICY': a short line in capitals, no digits, not a sentence."""
    if len(text) > LABEL_MAX_CHARS:
        return False  # most lines: their letters are not looked at
    letters = [ch for ch in text if ch.isalpha()]
    return (
        len(letters) >= CAPS_MIN_LETTERS
        and all(ch.isupper() for ch in letters)
        and not any(ch.isdigit() for ch in text)
        and not _LABEL_END.search(text)
        and not text.endswith((":", "："))  # 'NOTES:', 'APPEARANCES:' over a list of items
    )


def _in_table(lines: list[Line], i: int) -> bool:
    """Whether the line before or after line i is a table row (more than `CELLS_MAX` runs)."""
    return any(0 <= k < len(lines) and lines[k].cells > CELLS_MAX for k in (i - 1, i + 1))


def _apart(line: Line, following: Line) -> bool:
    """A label set well apart from the next line (a block of its own follows, not a list)."""
    return following.page != line.page or following.top - line.top > LABEL_GAP


def _same_size(a: float, b: float) -> bool:
    """Whether two font sizes (points) set one heading level."""
    return abs(a - b) <= max(SAME_SIZE, SAME_SIZE_SHARE * max(a, b))


def _size_levels(sizes: set[float]) -> dict[float, int]:
    """Heading level per font size, largest first; sizes within `SAME_SIZE` of the largest of
    a level share it (a title set partly in a 16 pt and partly in a 17 pt font is one level)."""
    levels: dict[float, int] = {}
    top: float | None = None
    for size in sorted(sizes, reverse=True):
        if top is None or not _same_size(top, size):
            top = size
        levels[size] = len(set(levels.values()) | {0}) if top == size else levels[top]
    return levels


def font_headings(
    lines: list[Line], stop: int | None = None, text_only: frozenset[int] = frozenset()
) -> list[Heading]:
    """Headings of a PDF without an outline, from how its lines are set.

    - large: at least `HEADING_SCALE` x the body size; sizes give the levels (largest first);
      consecutive large lines of about one size, each right under the last, are one (wrapped)
      heading; a run of more than
      `HEADING_MAX_LINES` lines or `HEADING_MAX_CHARS` chars is text set large (a table).
    - numbered: '§ 1 Usage', '2.1 Format' in another font than the body text but not larger
      (sans-serif or bold section heads); level after the large ones, by number depth. Of more
      than two in a row only the last is a heading: the others are a contents list.
      Larger lines right under the title, before any text (author, date), are text; so are
      those under the title repeated (a letterhead).
    - label: a short unnumbered line in a bold or sans font ('Abstract', '概要', 'Approval:'),
      or in capitals ('PAYMENT METHOD'), at the level of a first-depth numbered heading; not a
      field ('Report ID: 1234'), a table cell (digits, or runs of text apart) or one of a list
      of labels (of labels in a row only one set apart from the next is a heading).

    Never headings: a page number ('page 1 / 1': one the page furniture did not take), a table
    row (more than `CELLS_MAX` runs of text far apart, or two ending in a number: 'GRAND TOTAL
    5,738'; two headings side by side in two columns stay one), a line with more digits than
    letters ('*TXN9876520241123*'), and the lines in `text_only` (contents entries).

    The statistics (body size and font) come from every line; headings are looked for only in
    lines[:stop] (an outlined PDF: its title page, before the first outline entry).
    """
    if not lines:
        return []
    kinds = _line_kinds(lines, text_only)
    level_of = _size_levels({ln.size for ln, k in zip(lines, kinds, strict=True) if k == "large"})
    below = max(level_of.values(), default=0)
    headings: list[Heading] = []
    end = len(lines) if stop is None else stop
    title = _Title()
    i = 0
    while i < end:
        line, j = lines[i], i + 1
        if kinds[i] == "large":
            heading, j = _large_heading(lines, kinds, i, end, level_of, title)
            headings += [heading] if heading else []
        elif kinds[i] == "numbered":
            while j < end and kinds[j] == "numbered":
                j += 1
            first = j - 1 if j - i > 2 else i  # a contents list: only its last line is a heading
            for k in range(first, j):
                level = below + _number_depth(lines[k].text)
                headings.append(Heading(k, level, lines[k].text, 1))
        elif kinds[i] == "label" and (
            j == len(lines) or kinds[j] == "body" or _apart(line, lines[j])
        ):
            headings.append(Heading(i, below + 1, line.text, 1))
        elif title.size is not None:
            title.body_seen = True
        i = j
    return headings


def _line_kind(line: Line, body: float, body_font: str) -> str:
    """'large', 'numbered', 'label' or 'body': what the way a line is set makes it, given the
    body text's size and font (see `font_headings`)."""
    kind = _set_as(line, body, body_font)
    if kind == "body" or _never_heading(line):  # in this order: most lines are set as body
        return "body"
    return kind


def _never_heading(line: Line) -> bool:
    """A line too long, a table row ('GRAND TOTAL   5,738'), without letters or a page number."""
    text = line.text
    return bool(
        len(text) > HEADING_MAX_CHARS
        or line.cells > CELLS_MAX
        or (line.cells == CELLS_MAX and not any(c.isalpha() for c in text.split()[-1]))
        or _AMOUNT.match(text.split()[-1])
        or not any(ch.isalpha() for ch in text)
        or is_page_number(text)
    )


def _set_as(line: Line, body: float, body_font: str) -> str:
    """What the line's size and font make it, before `_never_heading` is asked."""
    text = line.text
    if line.size >= body * HEADING_SCALE:
        return "large"
    if line.cells == 1 and _caps_label(text):
        return "label"
    if line.font == body_font or _MONO.search(line.font):
        return "body"
    if len(text) <= HEADING_MAX_CHARS // 2 and _number_depth(text) > 0:
        return "numbered"
    if (
        len(text) <= LABEL_MAX_CHARS
        and text[0].isalnum()
        and not any(ch.isdigit() for ch in text)
        and _HEAVY.search(line.font)
        and not _LABEL_END.search(text)
        and not _KEY_VALUE.search(text)
        and not (text.endswith((":", "：")) and text.isupper())
    ):
        return "label"
    return "body"


def _line_kinds(lines: list[Line], text_only: frozenset[int]) -> list[str]:
    """`_line_kind` of every line against the document's body style; contents entries
    (`text_only`), lines with more digits than letters and labels between table rows are body."""
    body, body_font = body_style(lines)
    kinds = [
        "body" if i in text_only else _line_kind(ln, body, body_font) for i, ln in enumerate(lines)
    ]
    for i, line in enumerate(lines):
        if kinds[i] != "body" and sum(c.isdigit() for c in line.text) > sum(
            c.isalpha() for c in line.text
        ):
            kinds[i] = "body"  # '*TXN98765202411231432*', 'Phone: (425) 000-0000'.
    for i, line in enumerate(lines):
        if kinds[i] == "label" and line.cells > 1 and _in_table(lines, i):
            kinds[i] = "body"  # 'Continent   Asia   Europe' between rows of a table
    return kinds


@dataclass(slots=True)
class _Title:
    """What `font_headings` has seen of the title so far (its first heading)."""

    size: float | None = None  # the first heading's size
    text: str = ""
    body_seen: bool = False  # text since the title (lines set large under it are headings)


def _large_heading(
    lines: list[Line],
    kinds: list[str],
    i: int,
    end: int,
    level_of: dict[float, int],
    title: _Title,
) -> tuple[Heading | None, int]:
    """The heading the large lines from lines[i] make (None: they are text), and the index of
    the line after them: lines of about one size, each right under the last, are one wrapped
    heading; more than `HEADING_MAX_LINES` of them, or `HEADING_MAX_CHARS`, are text."""
    line, j = lines[i], i + 1
    while (
        j < end
        and kinds[j] == "large"
        and _same_size(lines[j].size, line.size)
        and 0 < lines[j].top - lines[j - 1].top <= WRAP_STEP
        and lines[j].page == line.page
    ):
        j += 1
    text = " ".join(ln.text for ln in lines[i:j])
    if j - i > HEADING_MAX_LINES or len(text) > HEADING_MAX_CHARS:
        title.body_seen = True  # a table or a passage set large: text
        return None, j
    if (
        title.size is not None
        and not title.body_seen
        and line.size < title.size
        and not _same_size(line.size, title.size)
    ):
        title.body_seen = True  # author / date lines under the title: text, not headings
        return None, j
    if title.size is None:
        title.size, title.text = line.size, text
    elif text == title.text:
        title.body_seen = False  # the letterhead again (a second invoice): its lines too
    return Heading(i, level_of[line.size], text, j - i), j


def keep_heading_text(
    headings: list[Heading], end: int, bookmarked: frozenset[int] = frozenset()
) -> list[Heading]:
    """The headings, less those that would lose their text: a heading with no text under it,
    followed by one of its own level or higher or by the end ('Variance Analysis:' over a chart,
    a one-line PDF), is body text of the section before (a section needs a body; a heading over
    a subheading lives on in the subheading's title). An outline entry found on its page (its
    line in `bookmarked`) stays a section over a drawing too: its own line is its text."""
    ordered = sorted(headings, key=lambda h: h.at)
    out: list[Heading] = []
    for k, heading in enumerate(ordered):
        after = ordered[k + 1] if k + 1 < len(ordered) else None
        empty = (after.at if after else end) <= heading.at + heading.consumed
        if heading.consumed and empty and (after is None or after.level <= heading.level):
            if heading.at not in bookmarked:
                continue
            heading = replace(heading, consumed=0)  # the title line is the section's text
        out.append(heading)
    return out


def document_lines(doc: pypdfium2.PdfDocument) -> list[Line]:
    """Every page's lines, page furniture left out, soft hyphens rejoined."""
    lines = [line for n in range(len(doc)) for line in page_lines(doc[n], n + 1)]
    if not lines:
        return []
    furniture = find_furniture(lines)
    kept = [line for i, line in enumerate(lines) if i not in furniture] or lines
    return rejoin_hyphens(kept)


def read_pdf(rel: str, data: bytes) -> tuple[list[Draft], list[SkippedInput]]:
    """Sections of one PDF (ids ``<relpath>#<anchor>``; `Draft.line` is the start page)."""
    import pypdfium2 as pdfium

    try:
        doc = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        message = str(exc)
        if "password" in message.lower():
            reason = "encrypted PDF (needs a password): decrypt it (e.g. qpdf --decrypt) first"
        else:
            reason = f"cannot read PDF ({message})"
        return [], [SkippedInput(file=rel, line=0, reason=reason)]
    try:
        lines = document_lines(doc)
        entries = outline_entries(doc)
        pages = len(doc)
    finally:
        doc.close()
    if not lines:
        reason = (
            f"PDF has no text layer ({pages} page(s), scanned images?): "
            "OCR it first (e.g. ocrmypdf) to index it"
        )
        return [], [SkippedInput(file=rel, line=0, reason=reason)]
    contents = frozenset(contents_lines(lines))
    headings: list[Heading] = []
    bookmarked: frozenset[int] = frozenset()
    if entries:  # the outline, trusted when most of its titles are on their pages
        placed, found = outline_headings(lines, entries)
        if found >= OUTLINE_TRUST * len(entries):
            stop = min((h.at for h in placed), default=0)
            headings = font_headings(lines, stop, contents) + placed
            bookmarked = frozenset(h.at for h in placed if h.consumed)
    if not headings:
        headings = font_headings(lines, text_only=contents)
    headings = keep_heading_text(headings, len(lines), bookmarked)
    builder = DraftBuilder(rel)
    at: dict[int, list[Heading]] = {}
    for heading in headings:
        at.setdefault(heading.at, []).append(heading)
    skip_until = 0
    for i, line in enumerate(lines):
        for heading in at.get(i, ()):
            builder.heading(heading.level, heading.text, line.page, page=line.page)
            skip_until = max(skip_until, i + heading.consumed)
        if i < skip_until:
            continue
        builder.body(line.text, page=line.page)
    return builder.finish(), []
