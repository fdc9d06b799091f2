"""A PDF's text lines as a reader sees them (pypdfium2): clean characters, soft hyphens rejoined,
page furniture (running headers and footers, page numbers) recognised, contents pages found.

What pdfium hands over and what is done with it:

- a soft hyphen at a line end comes as U+FFFE (or U+00AD): 'Prae\\ufffe' + 'sent ipsum' becomes
  'Praesent' + 'ipsum' (the word moves up, so the first line keeps whole words);
- C0 control characters other than tab and newline (a '\\x04' proof box, a '\\x08' for a large
  brace in a formula), U+FFFE/U+FFFF and stray soft hyphens are dropped; a tab becomes a space;
- page furniture: among the three top and three bottom lines of every page, from the edge
  inwards, lines that carry the page's number (alone, 'Page 3 of 9', '- 3 -', 'iv', or at
  either end of a running header '19 1.6. WEGE UND KNOTEN') with an offset from the page index
  that at least two pages share (or none, on the outermost line: 'iii' on the third page), or
  whose text repeats there on at least `REPEAT_PAGES` pages (digits masked; a line set larger
  than the body text must repeat exactly);
- a contents page: at least `CONTENTS_MIN_LINES` lines, and `CONTENTS_SHARE` of them, that end
  in a page number (dot leaders or not: '1.1 Topologische Räume . . . 2', '2 Second section iv').
"""

from __future__ import annotations

import ctypes
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pypdfium2

REPEAT_PAGES = 3  # a line repeated at a page edge on this many pages is a running header/footer
EDGE_LINES = 3  # lines at the top and at the bottom of a page that may be furniture
EDGE_ZONE = 0.2  # ... when they are within this share of the page's height from its edge
CONTENTS_MIN_LINES = 3
CONTENTS_SHARE = 0.4
CELL_GAP_EMS = 2.0  # a horizontal gap this many font sizes wide separates table cells
CELLS_MAX_CHARS = 200  # longer lines are text, never headings: their cells are not measured
JOIN_EMS = 0.6  # a piece of text starting this many font sizes from a line's top is on it
_LEVEL = 0.005  # share of the page height within which two lines start level
_SIZE_STEP = 0.5  # font sizes are compared rounded to half a point
_LINE = re.compile(r"[^\r\n]+")
_SOFT_HYPHENS = "\ufffe\u00ad"
_DROP = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\ufffe\uffff\u00ad]")
_ROMAN = re.compile(r"^[ivxlc]{1,7}$", re.IGNORECASE)
# '3', 'iv', '- 3 -', 'Page 3', 'Page 3 of 9', 'Seite 3 von 9', '3 / 9', 'p. 3'
_PAGE_NUMBER = re.compile(
    r"^(?:page|seite|p\.|pg\.)?\s*[-–—]?\s*(\d{1,4}|[ivxlc]{1,7})\s*[-–—]?"
    r"\s*(?:(?:of|von|/)\s*\d{1,4})?$",
    re.IGNORECASE,
)
_EDGE_NUMBER = re.compile(r"^(\d{1,4})\s+\S|\S\s+(\d{1,4})$")
# a contents entry: text, optional dot leaders, a page number ('2 Second section iv')
_PAGE_TOKEN = re.compile(r"^(?:\d{1,4}|[ivxlc]{1,7})$", re.IGNORECASE)


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


def clean_text(text: str) -> str:
    """The line without control characters and pdfium's markers; tabs become spaces."""
    return _DROP.sub("", text.replace("\t", " "))


def _font_name(raw_textpage: object, index: int) -> str:
    """'LMSans10-Regular' for a character set in 'USBSTC+LMSans10-Regular'."""
    import pypdfium2.raw as pdfium_c

    buffer = ctypes.create_string_buffer(128)
    flags = ctypes.c_int()
    pdfium_c.FPDFText_GetFontInfo(raw_textpage, index, buffer, 128, ctypes.byref(flags))
    return buffer.value.decode("latin-1").rpartition("+")[2]


def _box(raw_textpage: object, index: int) -> tuple[float, float, float, float]:
    """(left, right, bottom, top) of one character, in points."""
    import pypdfium2.raw as pdfium_c

    edges = [ctypes.c_double() for _ in range(4)]
    pdfium_c.FPDFText_GetCharBox(raw_textpage, index, *(ctypes.byref(e) for e in edges))
    return edges[0].value, edges[1].value, edges[2].value, edges[3].value


def _size(raw_textpage: object, index: int) -> float:
    """The size a character is set in, in points: the font size scaled by its text matrix (a PDF
    may set every font at 1 pt and scale it with the matrix, where pdfium's font size says 1)."""
    import pypdfium2.raw as pdfium_c

    matrix = pdfium_c.FS_MATRIX()
    size = float(pdfium_c.FPDFText_GetFontSize(raw_textpage, index))
    if not pdfium_c.FPDFText_GetMatrix(raw_textpage, index, ctypes.byref(matrix)):
        return size
    scale = abs(matrix.a * matrix.d - matrix.b * matrix.c) ** 0.5
    return size * scale if scale > 0 else size


def _cells(raw_textpage: object, text: str, first: int, last: int, size: float) -> int:
    """1 + the gaps wider than `CELL_GAP_EMS` x the font size between text[first:last+1]'s
    words (a table row set on one line: 'Year    2022    Claim #    SF-1008')."""
    import pypdfium2.raw as pdfium_c

    edges = [ctypes.c_double() for _ in range(4)]
    refs = [ctypes.byref(e) for e in edges]
    gaps = 0
    for k in range(first + 1, last):
        if text[k].isspace() and not text[k - 1].isspace():
            after = k + 1
            while after < last and text[after].isspace():
                after += 1  # a space, or the line break between parts set on one baseline
            pdfium_c.FPDFText_GetCharBox(raw_textpage, k - 1, *refs)
            end = edges[1].value
            pdfium_c.FPDFText_GetCharBox(raw_textpage, after, *refs)
            gaps += edges[0].value - end > CELL_GAP_EMS * max(size, 1.0)
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
        lines: list[Line] = []
        for match in _LINE.finditer(text):
            raw_line = match.group()
            stripped = raw_line.strip()
            hyphen = stripped.endswith(tuple(_SOFT_HYPHENS))
            stripped = clean_text(stripped).strip()
            if not stripped:
                continue
            size, font, top, span = 0.0, "", 0.5, (0, 0)
            if aligned:
                first = match.start() + len(raw_line) - len(raw_line.lstrip())
                last = match.end() - 1 - (len(raw_line) - len(raw_line.rstrip()))
                middle = (first + last) // 2
                picks = {first, last} | ({middle} if not text[middle].isspace() else set())
                sizes = [_size(textpage.raw, i) for i in picks]
                size = round(statistics.median(sizes) / _SIZE_STEP) * _SIZE_STEP
                font = _font_name(textpage.raw, first)
                left, right, bottom, upper = _box(textpage.raw, first)
                if (
                    bottom > page_top
                    or upper < page_bottom
                    or left > page_right
                    or right < page_left
                ):
                    continue  # off the page: no reader sees it
                top = min(max((page_top - upper) / height, 0.0), 1.0)
                span = (first, last)
                edges = (left, _box(textpage.raw, last)[1])
            else:
                edges = (0.0, 0.0)
            marked = stripped + ("\u00ad" if hyphen else "")
            lines.append(Line(marked, size, number, font, top, 1, span, *edges, height))
        if not aligned:
            return lines
        return header_first(_measure_cells(textpage.raw, text, join_baselines(lines)))
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


def document_lines(doc: pypdfium2.PdfDocument) -> list[Line]:
    """Every page's lines, page furniture left out, soft hyphens rejoined."""
    lines = [line for n in range(len(doc)) for line in page_lines(doc[n], n + 1)]
    if not lines:
        return []
    furniture = find_furniture(lines)
    kept = [line for i, line in enumerate(lines) if i not in furniture] or lines
    return rejoin_hyphens(kept)


def _measure_cells(raw_textpage: object, text: str, lines: list[Line]) -> list[Line]:
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

    def measure(i: int) -> None:
        first, last = lines[i].span
        if last > first and out[i] is lines[i]:
            out[i] = replace(lines[i], cells=_cells(raw_textpage, text, first, last, lines[i].size))

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


def _mask(text: str) -> str:
    return re.sub(r"\d+", "0", " ".join(text.split()).casefold())


def _page_value(token: str) -> int | None:
    """3 for '3', 4 for 'iv', None for anything else."""
    if token.isdigit():
        return int(token)
    if not _ROMAN.match(token):
        return None
    values = {"i": 1, "v": 5, "x": 10, "l": 50, "c": 100}
    digits = [values[ch] for ch in token.lower()]
    return sum(-d if d < n else d for d, n in zip(digits, [*digits[1:], 0], strict=True))


def _edge_lines(lines: list[Line]) -> dict[int, tuple[list[int], list[int]]]:
    """Per page, the indices of its `EDGE_LINES` top lines and of its bottom lines, each list
    from the page's edge inwards."""
    by_page: dict[int, list[int]] = defaultdict(list)
    for i, line in enumerate(lines):
        by_page[line.page].append(i)
    edges: dict[int, tuple[list[int], list[int]]] = {}
    for page, indices in by_page.items():
        ordered = sorted(indices, key=lambda i: lines[i].top)
        top = [i for i in ordered[:EDGE_LINES] if lines[i].top < EDGE_ZONE]
        bottom = [i for i in ordered[::-1][:EDGE_LINES] if lines[i].top > 1 - EDGE_ZONE]
        edges[page] = (top, [i for i in bottom if i not in top])
    return edges


def _number_of(text: str, alone: bool) -> int | None:
    """The page number a furniture candidate carries: the whole line ('- 3 -', 'iv') when
    `alone`, else a number at either end of a running header ('19 1.6. WEGE UND KNOTEN')."""
    if alone:
        match = _PAGE_NUMBER.match(text.strip())
        return None if match is None else _page_value(match.group(1))
    match = _EDGE_NUMBER.search(text.strip())
    if match is None:
        return None
    return int(match.group(1) or match.group(2))


def _repeat_key(line: Line, body_size: float) -> str:
    """What must repeat across pages for a line to be a running header: its text with digits
    masked ('Page 0 of 0'), or for a line set larger than the body (a journal's name in the
    margin, never a numbered heading '2 Usage') its exact text."""
    if line.size > body_size:
        return "=" + " ".join(line.text.split()).casefold()
    masked = _mask(line.text)
    return masked if masked.strip("0 ") else ""  # digits alone never count as repeated text


def find_furniture(lines: list[Line]) -> set[int]:
    """Indices of running headers, footers and page numbers (see the module docstring): from
    each page edge inwards, lines are furniture until the first one that is not."""
    edges = _edge_lines(lines)
    body_size = body_style(lines)[0]
    offsets: dict[int, set[int]] = defaultdict(set)
    numbered: dict[int, int] = {}  # line index -> the offset of its number from the page's
    texts: dict[str, set[int]] = defaultdict(set)
    for page, (top, bottom) in edges.items():
        for i in top + bottom:
            key = _repeat_key(lines[i], body_size)
            if key:
                texts[key].add(page)
            if lines[i].size > body_size:
                continue  # '2 Usage' set large at a page top: a heading, not a number
            for alone in (True, False):
                value = _number_of(lines[i].text, alone)
                if value is not None and (alone or not _PAGE_NUMBER.match(lines[i].text)):
                    offsets[value - page].add(page)
                    numbered[i] = value - page
                    break
    shared = {o for o, on in offsets.items() if len(on) >= 2}
    repeated = {t for t, on in texts.items() if len(on) >= REPEAT_PAGES}
    out: set[int] = set()
    for top, bottom in edges.values():
        for side in (top, bottom):
            for n, i in enumerate(side):
                offset = numbered.get(i)
                number = offset in shared or (offset == 0 and n == 0)
                if not number and _repeat_key(lines[i], body_size) not in repeated:
                    break
                out.add(i)
    return out


def _contents_entry(text: str) -> bool:
    """'1.1 Topologische Räume . . . 2', '2 Second section iv': words, then a page number."""
    head, _, last = text.rpartition(" ")
    head = head.rstrip(". ")
    return bool(head) and _PAGE_TOKEN.match(last) is not None and any(c.isalpha() for c in head)


def contents_lines(lines: list[Line]) -> set[int]:
    """Indices of the entries of contents pages (never headings, never outline targets)."""
    by_page: dict[int, list[int]] = defaultdict(list)
    for i, line in enumerate(lines):
        by_page[line.page].append(i)
    out: set[int] = set()
    for indices in by_page.values():
        entries = [i for i in indices if _contents_entry(lines[i].text)]
        if len(entries) >= CONTENTS_MIN_LINES and len(entries) >= CONTENTS_SHARE * len(indices):
            out.update(entries)
    return out


def body_style(lines: list[Line]) -> tuple[float, str]:
    """The size and font most characters are set in."""
    weight: Counter[float] = Counter()
    fonts: Counter[str] = Counter()
    for line in lines:
        weight[line.size] += len(line.text)
        fonts[line.font] += len(line.text)
    return weight.most_common(1)[0][0], fonts.most_common(1)[0][0]
