"""Page furniture and contents pages of a PDF's lines: what is on every page but is not the
document's text, and the pages that list the headings rather than start them.

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

import re
from collections import defaultdict

from residency.corpus.pdf_layout import Line, body_style

REPEAT_PAGES = 3  # a line repeated at a page edge on this many pages is a running header/footer
EDGE_LINES = 3  # lines at the top and at the bottom of a page that may be furniture
EDGE_ZONE = 0.2  # ... when they are within this share of the page's height from its edge
CONTENTS_MIN_LINES = 3
CONTENTS_SHARE = 0.4
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


def is_page_number(text: str) -> bool:
    """Whether the line holds a page number in digits alone: '3', '- 3 -', 'page 1 / 1' (not
    'iv' or 'CIVIL': a word may be a roman numeral's letters)."""
    return _PAGE_NUMBER.match(text.strip()) is not None and any(ch.isdigit() for ch in text)


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
