"""A page's main element read block by block (lxml): used when the page names its main content
(``<main>``, ``role="main"``, ``<article>``, a microformat blog post), so nothing in it is lost to
a boilerplate guess.

Inside the main element, what is never main text is removed first: scripts and styles,
navigation, asides and complementary columns, forms, hidden elements, edit links and permalink
marks, tables of contents and navigation boxes, and blocks whose class or id names them as
sharing, related stories, advertising, comments or newsletter sign-ups. Then every heading
``h1``-``h6`` starts a section (its anchor: `heading_anchor`), a table is one row a line with
cells separated by ' | ', a list one item a line, ``pre`` as written, any other block one
paragraph.
"""

from __future__ import annotations

import re
from typing import Any

from residency.corpus.drafts import Draft, DraftBuilder

HEADING_TAGS = ("h1", "h2", "h3", "h4", "h5", "h6")
# Sphinx / MkDocs permalink marks (and Read the Docs' icon-font glyph) ending a heading's text.
PERMALINK = re.compile(r"[\s¶#🔗\u200b\uf0c1]+$")

# Where a page says its main content is, most specific first.
_CLASS = "contains(concat(' ', normalize-space(@class), ' '), ' {} ')"
MAIN_XPATHS = (
    "//main",
    "//*[@role='main']",
    "//article",
    "//*[@itemprop='articleBody']",
    f"//*[{_CLASS.format('hentry')} or {_CLASS.format('h-entry')}]",  # a blog post (hAtom)
)
_NOISE_TAGS = [
    "script",
    "style",
    "noscript",
    "template",
    "svg",
    "iframe",
    "nav",
    "aside",
    "form",
    "button",
    "select",
    "textarea",
    "dialog",
]
_NOISE_TAG_SET = frozenset(_NOISE_TAGS)
_VERBATIM = frozenset(("pre", "code", "math"))
_NOISE_ROLES = frozenset(("navigation", "complementary", "search"))
# Class / id words of blocks that are not the page's main text.
_NOISE_NAMES = re.compile(
    r"(?:^|[\s_-])(?:mw-editsection|headerlink|hash-link|toc|table-of-contents|navbox|share|"
    r"sharing|social|related|promo|"
    r"advert\w*|ads?|outbrain|comments?|sidebar|breadcrumbs?|newsletter|subscribe|signup|"
    r"cookie\w*|story-more|more-from\w*|visually-hidden|sr-only|screen-reader-text)(?:$|[\s_-])",
    re.I,
)
_BLOCKS = frozenset(
    [
        "p",
        "div",
        "section",
        "article",
        "main",
        "header",
        "footer",
        "li",
        "dt",
        "dd",
        "blockquote",
        "figure",
        "figcaption",
        "address",
        "details",
        "summary",
        "caption",
        "center",
        "hr",
        "ul",
        "ol",
        "dl",
        "table",
        "tr",
        "td",
        "th",
        "tbody",
        "thead",
    ]
)


def heading_anchor(el: Any) -> str | None:
    """A heading element's own anchor: its ``id``, else the ``id`` / ``name`` of an element inside
    it (Wikipedia's ``<h2><span id="History">``, ``<h3><a name="setup">``), never a wrapper's."""
    ident = el.get("id")
    if ident:
        return str(ident)
    for inner in el.iterdescendants():
        if not isinstance(inner.tag, str):
            continue
        ident = inner.get("id") or (inner.get("name") if inner.tag == "a" else None)
        if ident:
            return str(ident)
    return None


def _flat(el: Any) -> str:
    return " ".join("".join(el.itertext()).split())


def _common_ancestor(elements: list[Any]) -> Any:
    """The deepest element holding all of `elements`."""
    paths = [[*reversed(list(el.iterancestors())), el] for el in elements]
    common = paths[0][0]
    for nodes in zip(*paths, strict=False):
        if any(node is not nodes[0] for node in nodes):
            break
        common = nodes[0]
    return common


def main_element(tree: Any) -> Any | None:
    """The element the page names as its main content, or None. Several (a blog's front page:
    one ``<article>`` per post) give the element holding them all, so no post is lost."""
    for xpath in MAIN_XPATHS:
        found = tree.xpath(xpath)
        if not found:
            continue
        marked = set(found)
        outer = [el for el in found if not any(a in marked for a in el.iterancestors())]
        return outer[0] if len(outer) == 1 else _common_ancestor(outer)
    return None


def page_title(tree: Any, main: Any) -> Any | None:
    """The page's one ``h1`` when it stands outside `main` (a post's title in a header above
    the content), so the title is kept; None when `main` has its own or the page has several."""
    if next(main.iter("h1"), None) is not None:
        return None
    titles = [h for h in tree.iter("h1") if not _is_noise(h)]
    if len(titles) != 1 or any(_is_noise(a) for a in titles[0].iterancestors()):
        return None
    return titles[0]


def _is_noise(el: Any) -> bool:
    tag = el.tag
    if not isinstance(tag, str):
        return False
    if tag in _NOISE_TAG_SET:
        return True
    get = el.get
    if get("role") in _NOISE_ROLES or get("hidden") is not None:
        return True
    if get("aria-hidden") == "true" and tag != "img":  # a formula's image stays
        return True
    style = get("style")
    if style and "display:none" in style.replace(" ", "").lower():
        return True
    names = f"{get('class') or ''} {get('id') or ''}"
    return bool(names.strip()) and _NOISE_NAMES.search(names) is not None


def drop_noise(root: Any) -> None:
    """Remove from `root` what is never main text (see the module docstring), in one pass."""
    stack = list(root)
    while stack:
        el = stack.pop()
        if _is_noise(el):
            el.drop_tree()
        elif el.tag not in _VERBATIM:  # code is kept whole (Prism's "token comment" spans)
            stack.extend(el)


def _data_table(el: Any) -> bool:
    """A table of data, not a layout table holding headings, nested tables or paragraphs."""
    return not el.xpath(".//table | .//h1 | .//h2 | .//h3 | .//h4 | .//h5 | .//h6 | .//p")


class _Walk:
    """One pass over the main element feeding a `DraftBuilder`."""

    def __init__(self, builder: DraftBuilder) -> None:
        self.builder = builder
        self.inline: list[str] = []
        self.block = 0

    def emit(self, text: str) -> None:
        lines = (" ".join(line.split()) for line in text.split("\n"))
        kept = "\n".join(line for line in lines if line)
        if kept:
            self.block += 1
            self.builder.body(kept, sep="\n\n")

    def flush(self, prefix: str = "") -> None:
        text, self.inline = "".join(self.inline), []
        if text.strip():
            self.emit(prefix + text.strip())

    def element(self, el: Any) -> None:
        tag = el.tag.lower() if isinstance(el.tag, str) else ""
        if tag in HEADING_TAGS:
            self.flush()
            text = PERMALINK.sub("", _flat(el))
            if text:
                self.block += 1
                self.builder.heading(int(tag[1]), text, self.block, heading_anchor(el))
        elif tag == "pre":
            self.flush()
            self.block += 1
            code = el.text_content().strip("\n")
            if code.strip():
                self.builder.body(code, sep="\n\n")
        elif tag == "table" and _data_table(el):
            self.flush()
            rows = (
                " | ".join(_flat(c) for c in tr if c.tag in ("td", "th")) for tr in el.iter("tr")
            )
            caption = el.find("caption")
            lines = [_flat(caption)] if caption is not None else []
            self.emit("\n".join(lines + [r for r in rows if r.strip(" |")]))
        elif tag == "br":
            self.inline.append("\n")
        elif tag == "img" and "math" in (el.get("class") or ""):
            self.inline.append(el.get("alt") or "")  # a formula drawn as an image: its TeX
        elif tag in _BLOCKS:
            self.flush()
            self.children(el)
            self.flush("- " if tag == "li" else "")
        elif tag:
            self.children(el)
        if el.tail:
            self.inline.append(el.tail)

    def children(self, el: Any) -> None:
        if el.text:
            self.inline.append(el.text)
        for child in el:
            self.element(child)


def main_drafts(rel: str, main: Any, title: Any | None = None) -> list[Draft]:
    """The sections of a page's main element (noise already dropped), under the page's
    `title` heading when it stands outside that element."""
    walk = _Walk(DraftBuilder(rel))
    if title is not None:
        text = PERMALINK.sub("", _flat(title))
        if text:
            walk.builder.heading(1, text, 0, heading_anchor(title))
    walk.children(main)
    walk.flush()
    return walk.builder.finish()
