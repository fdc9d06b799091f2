"""A PDF's text lines as a reader sees them (pypdfium2): clean characters, soft hyphens rejoined,
pieces of one printed line joined, a letterhead drawn last read first (page furniture and
contents pages: `pdf_furniture`).

What pdfium hands over and what is done with it:

- a soft hyphen at a line end comes as U+FFFE (or U+00AD): 'Prae\\ufffe' + 'sent ipsum' becomes
  'Praesent' + 'ipsum' (the word moves up, so the first line keeps whole words);
- C0 control characters other than tab and newline (a '\\x04' proof box, a '\\x08' for a large
  brace in a formula), U+FFFE/U+FFFF and stray soft hyphens are dropped; a tab becomes a space;
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from residency.corpus.pdf_chars import PageChars

if TYPE_CHECKING:
    import pypdfium2

CELL_GAP_EMS = 2.0  # a horizontal gap this many font sizes wide separates table cells
CELLS_MAX_CHARS = 200  # longer lines are text, never headings: their cells are not measured
JOIN_EMS = 0.6  # a piece of text starting this many font sizes from a line's top is on it
_LEVEL = 0.005  # share of the page height within which two lines start level
_SIZE_STEP = 0.5  # font sizes are compared rounded to half a point
_LINE = re.compile(r"[^\r\n]+")
_SOFT_HYPHENS = ("\ufffe", "\u00ad")
_DROP = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\ufffe\uffff\u00ad]")
# what `_DROP` or a tab can find in a line (one without line breaks)
_DIRTY = re.compile(r"[\x00-\x09\x0b\x0c\x0e-\x1f\x7f\ufffe\uffff\u00ad]")
_GAP = re.compile(r"(?<=\S)\s+")  # a run of spaces after a word


@dataclass(frozen=True, slots=True)
class Line:
    """One text line of a page, with the font size it is set in (points, rounded)."""

    text: str
    size: float
    page: int  # 1-based
    font: str = ""  # the font of its first character (subset prefix dropped)
    top: float = 0.5  # where the line starts down the page, 0 = top edge, 1 = bottom edge
    cells: int = 1  # text runs separated by wide gaps (a table row has several; `_measure_cells`)
    span: tuple[int, int] = (0, 0)  # its first and last character in the page's text
    left: float = 0.0  # points: the left edge of its first character ...
    right: float = 0.0  # ... and the right edge of its last
    height: float = 842.0  # points: its page's height


def clean_line(text: str) -> str:
    """One line without control characters, pdfium's markers and soft hyphens; tabs become
    spaces (the loader's `clean_text.clean_text` then cleans every reader's whole text)."""
    return _DROP.sub("", text.replace("\t", " "))


def _line_size(chars: PageChars, text: str, first: int, last: int) -> float:
    """The median of the sizes of a line's first, middle and last characters (points): a
    superscript or a large initial at one end does not set the line's size. The middle one is
    asked for only where the ends differ (it cannot move the median otherwise)."""
    start = chars.size(first)
    if last == first:
        return start
    end = chars.size(last)
    middle = (first + last) // 2
    if middle in (first, last) or text[middle].isspace():
        return (start + end) / 2  # the median of two
    if start == end:
        return start
    return statistics.median((start, end, chars.size(middle)))


def _cells(chars: PageChars, text: str, first: int, last: int, size: float) -> int:
    """1 + the gaps wider than `CELL_GAP_EMS` x the font size between text[first:last+1]'s
    words (a table row set on one line: 'Year    2022    Claim #    SF-1008')."""
    gap_pt = CELL_GAP_EMS * max(size, 1.0)
    gaps = 0
    # each run of spaces (or the line break between parts set on one baseline) inside the line
    for run in _GAP.finditer(text, first + 1, last):
        gaps += chars.left(run.end()) - chars.right(run.start() - 1) > gap_pt
    return gaps + 1


def page_lines(page: pypdfium2.PdfPage, number: int) -> list[Line]:
    """The page's lines in pdfium's reading order, each with its font size and position; a
    line that ends in a soft hyphen keeps it as U+00AD for `rejoin_hyphens`. A line set outside
    the page (text a producer moved off the paper) is not on the page: left out."""

    textpage = page.get_textpage()
    page_left, page_bottom, page_right, page_top = page.get_bbox()
    height = (page_top - page_bottom) or 1.0
    try:
        count = textpage.count_chars()
        text = textpage.get_text_range(0, count)
        aligned = len(text) == count  # one str char per pdfium char (no surrogate pairs)
        chars = PageChars(textpage.raw)
        dirty = _DIRTY.search(text) is not None  # else no line needs `clean_line`
        lines: list[Line] = []
        for match in _LINE.finditer(text):
            raw_line = match.group()
            stripped = raw_line.strip()
            hyphen = stripped.endswith(_SOFT_HYPHENS)
            if dirty:
                stripped = clean_line(stripped).strip()
            if not stripped:
                continue
            size, font, top, span, edges = 0.0, "", 0.5, (0, 0), (0.0, 0.0)
            if aligned:
                first = match.start() + len(raw_line) - len(raw_line.lstrip())
                last = match.end() - 1 - (len(raw_line) - len(raw_line.rstrip()))
                left, right, bottom, upper = chars.box(first)
                if (
                    bottom > page_top
                    or upper < page_bottom
                    or left > page_right
                    or right < page_left
                ):
                    continue  # off the page: no reader sees it
                size = round(_line_size(chars, text, first, last) / _SIZE_STEP) * _SIZE_STEP
                font = chars.font(first)
                top = min(max((page_top - upper) / height, 0.0), 1.0)
                span = (first, last)
                edges = (left, chars.right(last))
            marked = stripped + ("\u00ad" if hyphen else "")
            lines.append(Line(marked, size, number, font, top, 1, span, *edges, height))
        if not aligned:
            return lines
        return header_first(_measure_cells(chars, text, join_baselines(lines)))
    finally:
        textpage.close()


def join_baselines(lines: list[Line]) -> list[Line]:
    """Pieces of one printed line that pdfium set on lines of their own made one line again: a
    superscript or subscript and the text after it ('S' + '2' + 'lässt sich' -> 'S 2 lässt
    sich'), a footnote mark. A piece joins the line before, after a space, when it starts within
    `JOIN_EMS` of that line's top and to the right of its end (a soft hyphen joins without)."""
    out: list[Line] = []
    for line in lines:
        prev = out[-1] if out else None
        em = max(line.size, prev.size if prev else 0.0, 1.0)
        if (
            prev is None
            or abs(line.top - prev.top) * line.height >= JOIN_EMS * em
            or line.left < prev.right - 0.5 * em
            or line.right <= line.left
        ):
            out.append(line)
            continue
        head, sep = prev.text, " "
        if head.endswith("\u00ad"):
            head, sep = head[:-1], ""
        base = prev if len(prev.text) >= len(line.text) else line
        out[-1] = replace(
            prev,
            text=head + sep + line.text,
            size=base.size,
            font=prev.font,
            span=(prev.span[0], line.span[1]),
            right=line.right,
        )
    return out


def header_first(lines: list[Line]) -> list[Line]:
    """One page's lines with a letterhead drawn last moved to the front: when the page's stream
    ends in lines that all sit above its first line, they are its top block, read first (in
    order down the page). Columns are untouched: a second column starts level with the first."""
    if len(lines) < 2:
        return lines
    start = len(lines)
    while start > 1 and lines[start - 1].top < lines[0].top - _LEVEL:
        start -= 1
    if start == len(lines):
        return lines
    return sorted(lines[start:], key=lambda ln: ln.top) + lines[:start]


def _measure_cells(chars: PageChars, text: str, lines: list[Line]) -> list[Line]:
    """`Line.cells` of one page's lines that could be headings (larger than most of the page's
    text, in another font and short or numbered, or in capitals), and of the neighbours of those
    with several runs; a character box costs a call into pdfium, so body text stays at one."""
    if not lines:
        return lines
    size, font = body_style(lines)
    wanted: set[int] = set()
    for i, line in enumerate(lines):
        text_i = line.text
        if len(text_i) > CELLS_MAX_CHARS:
            continue
        if (
            line.size > size
            or text_i.isupper()
            or (line.font != font and (len(text_i) <= 40 or text_i[:1].isdigit()))
        ):
            wanted.add(i)
    out = list(lines)
    measured: set[int] = set()

    def measure(i: int) -> None:
        first, last = lines[i].span
        if last > first and i not in measured:
            measured.add(i)
            cells = _cells(chars, text, first, last, lines[i].size)
            if cells != lines[i].cells:
                out[i] = replace(lines[i], cells=cells)

    for i in wanted:
        measure(i)
        if out[i].cells > 1:  # a table row, or a label in a table: the rows around it tell
            for k in (i - 1, i + 1):
                if 0 <= k < len(lines):
                    measure(k)
    return out


def rejoin_hyphens(lines: list[Line]) -> list[Line]:
    """Words split by a soft hyphen made whole: the next line's first word moves up
    ('Prae\\u00ad' + 'sent ipsum' -> 'Praesent' + 'ipsum'); a line left empty goes."""
    out = list(lines)
    for i, line in enumerate(out):
        if not line.text.endswith("\u00ad"):
            continue
        head = line.text[:-1]
        if i + 1 < len(out) and out[i + 1].text:
            word, _, rest = out[i + 1].text.partition(" ")
            out[i] = replace(line, text=head + word)
            out[i + 1] = replace(out[i + 1], text=rest.strip())
        else:
            out[i] = replace(line, text=head)
    return [line for line in out if line.text]


def body_style(lines: list[Line]) -> tuple[float, str]:
    """The size and font most characters are set in."""
    weight: dict[float, int] = {}
    fonts: dict[str, int] = {}
    for line in lines:
        n = len(line.text)
        weight[line.size] = weight.get(line.size, 0) + n
        fonts[line.font] = fonts.get(line.font, 0) + n
    # the first of equals, as Counter.most_common(1) picks
    return max(weight, key=weight.__getitem__), max(fonts, key=fonts.__getitem__)
