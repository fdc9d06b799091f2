"""Word (.docx) files into sections (python-docx, `residency[docx]`): paragraphs in a heading
style are the headings.

A paragraph is a heading of level N when its style, or a style it is based on, is Word's built-in
"Heading N" (Word stores the English built-in name even in a localised Word, where the user sees
e.g. 見出し 1), or when the paragraph sets an outline level itself; "Title" sits above level 1.
Tables are kept in document order, one row a line, cells separated by ' | '.

Why python-docx: it and mammoth kept every character and every heading of the shipped files;
python-docx was 1.4-2.3x faster (see docs/index-and-retrieval.md).
"""

from __future__ import annotations

import re
from typing import Any

from residency.corpus.drafts import Draft, DraftBuilder
from residency.corpus.model import SkippedInput

_HEADING_STYLE = re.compile(r"^heading ([1-9])$", re.IGNORECASE)
_TITLE_LEVEL = 0


def heading_level(paragraph: Any) -> int | None:
    """The paragraph's heading level (0 = Title), or None for body text."""
    outline = paragraph._p.xpath("./w:pPr/w:outlineLvl/@w:val")
    if outline and str(outline[0]).isdigit() and int(outline[0]) < 9:
        return int(outline[0]) + 1
    style = paragraph.style
    seen = 0
    while style is not None and seen < 10:
        name = (style.name or "").strip()
        match = _HEADING_STYLE.match(name)
        if match:
            return int(match.group(1))
        if name.lower() == "title":
            return _TITLE_LEVEL
        style, seen = style.base_style, seen + 1
    return None


def _table_text(table: Any) -> str:
    rows = []
    for row in table.rows:
        cells: list[str] = []
        for cell in row.cells:
            text = " ".join(cell.text.split())
            if not cells or cells[-1] != text:  # a merged cell repeats across its span
                cells.append(text)
        if any(cells):
            rows.append(" | ".join(cells))
    return "\n".join(rows)


def read_docx(rel: str, data: bytes) -> tuple[list[Draft], list[SkippedInput]]:
    """Sections of one .docx file (`Draft.line` is the heading's paragraph number)."""
    import io
    import zipfile

    import docx
    from docx.table import Table

    try:
        document = docx.Document(io.BytesIO(data))
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        reason = f"cannot read DOCX ({exc}); is it a Word 2007+ .docx (not .doc or encrypted)?"
        return [], [SkippedInput(file=rel, line=0, reason=reason)]
    builder = DraftBuilder(rel)
    for n, block in enumerate(document.iter_inner_content(), start=1):
        if isinstance(block, Table):
            builder.body(_table_text(block), sep="\n\n")
            continue
        text = block.text.strip()
        if not text:
            continue
        level = heading_level(block)
        if level is None:
            builder.body(text, sep="\n\n")
        else:
            builder.heading(level, " ".join(text.split()), n)
    drafts = builder.finish()
    if not drafts:
        return [], [SkippedInput(file=rel, line=0, reason="no text in the document body")]
    return drafts, []
