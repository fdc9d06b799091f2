"""Markdown files into sections through a CommonMark parser (markdown-it-py), front matter as
metadata.

Every heading CommonMark sees starts a section: ATX (``## Title``) and setext (``Title`` over
``===`` / ``---``), also inside block quotes and list items, and a raw HTML block that is one
``<h1>``–``<h6>`` element. A ``#`` line inside a fenced or indented code block or an HTML block is
text. A section's text is the source lines between its heading and the next, as written. Ids:
an explicit pandoc ``{#anchor}`` (or the HTML heading's ``id``), else the slug of the heading
(`DraftBuilder`), so a file without these constructs keeps the ids the former line splitter gave.

YAML front matter (``---`` first line ... ``---``) is not text: its ``date`` (YYYY-MM-DD) and
``tags`` (a list or one string) apply to every section of the file; a front matter that is not
valid YAML is reported as a skipped input and the rest of the file is indexed. Its ``title`` is
the title of the text before the first heading (id ``#_preamble`` as before, so ids stay
stable). A MultiMarkdown / Pelican metadata block (``Title: ...`` and other ``key: value`` lines
first in the file, ended by a blank line) is read the same way when it has a title: metadata,
never text of a section.
"""

from __future__ import annotations

import datetime as dt
import html
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from residency.corpus.drafts import Draft, DraftBuilder
from residency.corpus.model import SkippedInput

if TYPE_CHECKING:
    from markdown_it import MarkdownIt

_CLOSING_HASHES = re.compile(r"(?:^|[ \t]+)#+$")
_ATTRS = re.compile(r"[ \t]*\{([^{}]*)\}$")
_HTML_HEADING = re.compile(r"^\s*<h([1-6])(\s[^>]*)?>(.*?)</h\1>\s*$", re.IGNORECASE | re.DOTALL)
_HTML_ID = re.compile(r"""\bid\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.IGNORECASE)
_TAG = re.compile(r"<[^>]+>")
_META_LINE = re.compile(r"^([A-Za-z][\w -]{0,40}):[ \t]*(.*)$")


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    from markdown_it import MarkdownIt
    from mdit_py_plugins.front_matter import front_matter_plugin

    # Only block structure is needed (a heading's text is its inline token's source): inline
    # parsing was ~70% of the reader's time on long READMEs.
    return MarkdownIt("commonmark").use(front_matter_plugin).disable("inline")


def split_heading(raw: str) -> tuple[str, str | None]:
    """('Heading text', explicit anchor or None) from a heading's inline source.

    >>> split_heading("Daily check {#lamp-daily-check}")
    ('Daily check', 'lamp-daily-check')
    """
    text = _CLOSING_HASHES.sub("", raw.strip())
    anchor = None
    attrs = _ATTRS.search(text)
    if attrs:
        ids = [a[1:] for a in attrs.group(1).split() if a.startswith("#") and len(a) > 1]
        if ids:
            anchor = ids[0]
            text = text[: attrs.start()]
    return " ".join(text.split()) if "\n" in text else text.strip(), anchor


def _html_heading(block: str) -> tuple[int, str, str | None] | None:
    """(level, text, id) when a raw HTML block is exactly one heading element."""
    match = _HTML_HEADING.match(block)
    if match is None:
        return None
    ident = _HTML_ID.search(match.group(2) or "")
    anchor = (ident.group(1) or ident.group(2)) if ident else None
    text = " ".join(html.unescape(_TAG.sub("", match.group(3))).split())
    return int(match.group(1)), text, anchor or None


def metadata_block(lines: list[str]) -> tuple[int, str | None]:
    """(lines, title) of a MultiMarkdown / Pelican metadata block opening the file: ``key:
    value`` lines up to a blank line, one of them ``title``; (0, None) when there is none.

    >>> metadata_block(["Title: Lamp care", "Date: 2024-05-01", "", "Text"])
    (2, 'Lamp care')
    """
    title = None
    n = 0
    while n < len(lines) and lines[n].strip():
        found = _META_LINE.match(lines[n])
        if found is None:
            if n == 0 or not lines[n][:1].isspace():  # an indented line continues a value
                return 0, None
        elif found.group(1).strip().lower() == "title":
            title = found.group(2).strip()
        n += 1
    return (n, title) if title else (0, None)


_FrontMatter = tuple[dt.date | None, tuple[str, ...], SkippedInput | None, str | None]


def _front_matter(rel: str, raw: str) -> _FrontMatter:
    """(date, tags, problem, title) from a YAML front matter block."""
    import yaml

    try:
        meta: Any = yaml.safe_load(raw)
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: 'date: 2024-13-45'
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        reason = f"front matter: invalid YAML ({first}); indexed without it"
        return None, (), SkippedInput(file=rel, line=1, reason=reason), None
    if not isinstance(meta, dict):
        return None, (), None, None
    raw_title = meta.get("title")
    title = " ".join(str(raw_title).split()) if raw_title not in (None, "") else None
    day: dt.date | None = None
    raw_date = meta.get("date")
    if isinstance(raw_date, dt.datetime):
        day = raw_date.date()
    elif isinstance(raw_date, dt.date):
        day = raw_date
    elif isinstance(raw_date, str):
        try:
            day = dt.date.fromisoformat(raw_date.strip())
        except ValueError:
            reason = f"front matter: date {raw_date!r} is not YYYY-MM-DD; indexed without a date"
            problem = SkippedInput(file=rel, line=1, reason=reason)
            return None, _tags(meta.get("tags")), problem, title
    return day, _tags(meta.get("tags")), None, title


def _tags(raw: object) -> tuple[str, ...]:
    if isinstance(raw, str):
        return tuple(t for t in (p.strip() for p in raw.replace(",", " ").split()) if t)
    if isinstance(raw, list):
        return tuple(str(t).strip() for t in raw if str(t).strip())[:256]
    return ()


def parse_markdown(
    stem: str, text: str, rel: str | None = None
) -> tuple[list[Draft], list[SkippedInput]]:
    """Sections of one markdown file (`stem` = relpath without .md), and front matter problems."""
    lines = text.splitlines()
    builder = DraftBuilder(stem)
    skipped: list[SkippedInput] = []
    body_from = 0  # first source line (0-based) of the current section's body
    meta_lines, title = metadata_block(lines)
    if title is not None:  # blanked, so CommonMark's line numbers stay the file's
        text = "\n" * meta_lines + "\n".join(lines[meta_lines:])
        body_from = meta_lines
        while body_from < len(lines) and not lines[body_from].strip():
            body_from += 1
        builder.begin_at(body_from + 1)
        builder.title_preamble(title)
    tokens = _parser().parse(text)
    for i, token in enumerate(tokens):
        heading: tuple[int, str, str | None] | None = None
        if token.type == "front_matter" and token.map is not None and token.map[0] == 0:
            builder.date, builder.tags, problem, title = _front_matter(rel or stem, token.content)
            skipped += [problem] if problem else []
            body_from = token.map[1]
            if title is not None:
                builder.title_preamble(title)
            builder.begin_at(body_from + 1)
            continue
        if token.type == "heading_open":
            inline = tokens[i + 1].content if i + 1 < len(tokens) else ""
            text_, anchor = split_heading(inline)
            heading = (int(token.tag[1:]), text_, anchor)
        elif token.type == "html_block":
            heading = _html_heading(token.content)
        if heading is None or token.map is None:
            continue
        start, end = token.map
        builder.body("\n".join(lines[body_from:start]))
        level, heading_text, anchor = heading
        builder.heading(level, heading_text, start + 1, anchor)
        body_from = end
    builder.body("\n".join(lines[body_from:]))
    return builder.finish(), skipped
