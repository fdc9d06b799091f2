"""A PDF's outline (bookmarks) placed on its pages: each entry's title looked up on the page it
points to, so an outline is trusted only as far as the page text bears it out."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import TYPE_CHECKING, Any

from residency.corpus.pdf_layout import Line

if TYPE_CHECKING:
    import pypdfium2

PREFIX_MIN_CHARS = 10  # letters and digits an outline title needs to be found at a line's start
TITLE_MATCH = 0.8  # similarity (difflib ratio) at which page text is an outline entry's title
# '§ 2 Usage', '2.1 Format', 'A.1 Options', '第2章 使い方' (the number, then a title)
NUMBERED = re.compile(r"^(?:§\s*)?(\d{1,2}(?:\.\d{1,2}){0,3}|[A-Z](?:\.\d{1,2}){1,3})\.?\s+\S")


@dataclass(frozen=True, slots=True)
class Heading:
    """Where a section starts: the index of its first line in the document's line list."""

    at: int
    level: int
    text: str
    consumed: int  # lines the heading itself takes (0: an outline entry not found on its page)


def _key(text: str) -> str:
    """NFKC, case-folded, letters and digits only: how an outline title is compared with page
    text (so 'pLaTeX2e' in an outline still meets 'pLATEX 2ε' set as a logo on the page)."""
    return "".join(ch for ch in unicodedata.normalize("NFKC", text).casefold() if ch.isalnum())


class _LineKeys:
    """`_key` of each line's text, computed when first asked for (a page's lines are compared
    with every outline entry pointing at the page)."""

    def __init__(self, lines: list[Line]) -> None:
        self._lines = lines
        self._keys: dict[int, str] = {}

    def __getitem__(self, i: int) -> str:
        key = self._keys.get(i)
        if key is None:
            key = self._keys[i] = _key(self._lines[i].text)
        return key


def outline_entries(doc: pypdfium2.PdfDocument) -> list[tuple[int, str, int]]:
    """(level from 1, title, 0-based page) of every outline entry that points at a page."""
    entries: list[tuple[int, str, int]] = []
    for bookmark in doc.get_toc():
        dest: Any = bookmark.get_dest()
        page = dest.get_index() if dest is not None else None
        title = " ".join((bookmark.get_title() or "").split())
        if page is not None and title:
            entries.append((bookmark.level + 1, title, int(page)))
    return entries


def _find_title(keys: _LineKeys, start: int, end: int, title: str) -> tuple[int, int] | None:
    """(first line, lines taken) of the best match of `title` among lines[start:end] (compared
    by their `keys`): one to three consecutive lines whose text is at least `TITLE_MATCH`
    similar to it; failing that, a line that starts with it (a title of `PREFIX_MIN_CHARS` or
    more), taking no line."""
    want = _key(title)
    if not want:
        return None
    best: tuple[float, int, int] | None = None
    for i in range(start, end):
        joined = ""
        for j in range(i, min(i + 3, end)):
            joined += keys[j]
            if len(joined) > 2 * len(want):
                break
            if joined == want:
                return i, j - i + 1
            matcher = SequenceMatcher(None, joined, want, autojunk=False)
            if matcher.real_quick_ratio() < TITLE_MATCH or matcher.quick_ratio() < TITLE_MATCH:
                continue
            ratio = matcher.ratio()
            if ratio >= TITLE_MATCH and (best is None or ratio > best[0]):
                best = (ratio, i, j - i + 1)
        if best is not None and best[0] == 1.0:
            break
    if best is None and len(want) >= PREFIX_MIN_CHARS:
        # the title set on one line with something beside it ('Arrow Style and Size   First
        # Page'): its section starts there, the line kept as its text (0 lines taken)
        return next(((i, 0) for i in range(start, end) if keys[i].startswith(want)), None)
    return None if best is None else (best[1], best[2])


def _numbered_title(shown: str, title: str) -> str:
    """The outline's wording, with the section number the page sets before it ('1 Foo' for
    the entry 'Foo'): what a reader sees, and distinct where titles repeat."""
    match = NUMBERED.match(shown)
    if match is None or NUMBERED.match(title) or not _key(shown).endswith(_key(title)):
        return title
    return f"{match.group(1)} {title}"


def outline_headings(
    lines: list[Line], entries: list[tuple[int, str, int]]
) -> tuple[list[Heading], int]:
    """Outline entries placed on their page's lines (the matched lines are the heading), and how
    many of them were found there. An entry not found on its page starts its section at the page
    top when nothing else starts there."""
    bounds: dict[int, tuple[int, int]] = {}
    for i, line in enumerate(lines):
        first, _ = bounds.get(line.page, (i, i))
        bounds[line.page] = (first, i + 1)
    keys = _LineKeys(lines)
    headings: list[Heading] = []
    cursor = found_count = 0
    for level, title, page_index in entries:
        page = page_index + 1
        if page not in bounds:
            continue
        first, end = bounds[page]
        found = _find_title(keys, max(first, cursor), end, title)
        if found is not None:
            shown = " ".join(ln.text for ln in lines[found[0] : found[0] + found[1]])
            heading = Heading(found[0], level, _numbered_title(shown, title), found[1])
            found_count += 1
        elif cursor <= first:
            heading = Heading(first, level, title, 0)
        else:
            continue  # its page already has a heading before it: keep the text where it is
        headings.append(heading)
        cursor = heading.at + heading.consumed
    return headings, found_count
