"""HTML pages into sections (trafilatura, `residency[html]`): the main content only, its
``h1``–``h6`` as headings; navigation, sidebars, search boxes and footers dropped.

Why trafilatura: on the shipped pages and a longer Sphinx page it kept every character of the
main content (readability-lxml lost 2-5%) and every content heading with its level, and dropped
the sidebar headings ("Navigation", "Quick search"); see docs/index-and-retrieval.md.

Section ids are ``<relpath>#<anchor>``: the heading element's ``id`` where the page has one (the
link a reader follows, e.g. ``page.html#installation``), else the slug of the heading.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from residency.corpus.drafts import Draft, DraftBuilder
from residency.corpus.html_main import (
    HEADING_TAGS,
    PERMALINK,
    drop_noise,
    heading_anchor,
    main_drafts,
    main_element,
    page_title,
)
from residency.corpus.model import SkippedInput

_PERMALINK = PERMALINK
_HEADING_TAGS = HEADING_TAGS


def _heading_ids(tree: Any) -> dict[str, list[str | None]]:
    """Heading text -> the anchors of the page's headings with that text, in page order."""
    ids: dict[str, list[str | None]] = {}
    for el in tree.iter(*_HEADING_TAGS):
        text = _PERMALINK.sub("", " ".join(el.text_content().split()))
        ids.setdefault(text, []).append(heading_anchor(el))
    return ids


def _flat(el: Any) -> str:
    return " ".join("".join(el.itertext()).split())


def _list_lines(el: Any, depth: int) -> list[str]:
    """'- item' lines of a (nested) list, each item's text once."""
    lines: list[str] = []
    for item in el.iterchildren("item"):
        own = [item.text or ""]
        nested: list[str] = []
        for child in item:
            if child.tag == "list":
                nested += _list_lines(child, depth + 1)
            else:
                own.append("".join(child.itertext()))
            own.append(child.tail or "")
        lines.append("  " * depth + "- " + " ".join("".join(own).split()))
        lines += nested
    return lines


def block_text(el: Any) -> str:
    """The text of one block of trafilatura's XML: code as written, a list one item a line, a
    table one row a line with cells separated by ' | '."""
    if el.tag == "code":
        return "".join(el.itertext()).strip("\n")
    if el.tag == "list":
        return "\n".join(_list_lines(el, 0))
    if el.tag == "table":
        rows = (" | ".join(_flat(cell) for cell in row.iter("cell")) for row in el.iter("row"))
        return "\n".join(r for r in rows if r.strip(" |"))
    return _flat(el)


def _blocks(parent: Any) -> Iterator[Any]:
    """The blocks of trafilatura's XML in order; a layout table (cells holding headings or
    paragraphs, as on table-laid-out news sites) gives its cells' blocks, not one row a line."""
    for el in parent:
        if el.tag == "table" and el.find("row/cell/head") is not None:
            for cell in el.iter("cell"):
                loose = [cell.text or ""] + [child.tail or "" for child in cell]
                if "".join(loose).strip():
                    text = cell.makeelement("p", {})
                    text.text = " ".join(loose)
                    yield text
                yield from _blocks(cell)
        else:
            yield el


def read_html(rel: str, data: bytes) -> tuple[list[Draft], list[SkippedInput]]:
    """Sections of one HTML page's main content (`Draft.line` is the block's number)."""
    import lxml.etree
    import lxml.html

    try:
        tree = lxml.html.document_fromstring(data)
    except (lxml.etree.ParserError, ValueError) as exc:
        return [], [SkippedInput(file=rel, line=0, reason=f"cannot parse HTML ({exc})")]
    main = main_element(tree)
    marked: list[Draft] = []
    if main is not None:
        title = page_title(tree, main)
        drop_noise(main)
        marked = main_drafts(rel, main, title)
        # An empty main element is a page filled in by JavaScript; one holding little of the
        # page's text (a banner marked <main>) is checked against trafilatura's guess, and the
        # longer reading wins.
        if not marked or _chars(marked) >= _SMALL_MAIN * _page_chars(tree):
            return _or_skipped(rel, marked, "no text in the page's main element")
    guessed, skipped = _trafilatura_drafts(rel, tree)
    if _chars(marked) >= _chars(guessed):
        return _or_skipped(rel, marked, "no text in the page's main element")
    return guessed, skipped


_SMALL_MAIN = 0.1  # share of the page's characters under which a main element is doubted


def _ink(text: str) -> int:
    """Characters of `text` that are not whitespace."""
    return len(text) - sum(text.count(space) for space in " \n\t\r\xa0")


def _page_chars(tree: Any) -> int:
    """Non-space characters of the page's text, scripts and styles left out."""
    body = tree.find("body")
    if body is None:
        return 0
    hidden = sum(_ink(el.text or "") for el in body.iter("script", "style"))
    return _ink(body.text_content()) - hidden


def _chars(drafts: list[Draft]) -> int:
    return sum(_ink(d.text) for d in drafts)


def _or_skipped(rel: str, drafts: list[Draft], why: str) -> tuple[list[Draft], list[SkippedInput]]:
    if drafts:
        return drafts, []
    return [], [SkippedInput(file=rel, line=0, reason=f"{why} (filled in by JavaScript?)")]


def _trafilatura_drafts(rel: str, tree: Any) -> tuple[list[Draft], list[SkippedInput]]:
    """Sections of trafilatura's guess at the page's main content."""
    import lxml.etree
    import trafilatura

    for link in tree.xpath('//a[contains(concat(" ", @class, " "), " headerlink ")]'):
        link.drop_tree()
    ids = _heading_ids(tree)
    xml = trafilatura.extract(
        tree,
        output_format="xml",
        include_formatting=False,
        include_tables=True,
        include_comments=False,
        include_links=False,
        include_images=False,
        favor_recall=True,
    )
    if not xml:
        reason = "no main content found in the HTML page (only navigation or scripts?)"
        return [], [SkippedInput(file=rel, line=0, reason=reason)]
    root = lxml.etree.fromstring(xml.encode("utf-8"))
    main = root.find("main")
    builder = DraftBuilder(rel)
    for n, el in enumerate(_blocks(main if main is not None else root), start=1):
        text = block_text(el)
        rend = el.get("rend") or ""
        if el.tag == "head" and rend in _HEADING_TAGS:
            heading = _PERMALINK.sub("", text)
            anchors = ids.get(heading)
            builder.heading(int(rend[1]), heading, n, anchors.pop(0) if anchors else None)
        elif text:
            builder.body(text, sep="\n\n")
    drafts = builder.finish()
    if not drafts:
        return [], [SkippedInput(file=rel, line=0, reason="no text in the page's main content")]
    return drafts, []
