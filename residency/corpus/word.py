"""Word (.docx) files into sections (python-docx, `residency[docx]`): paragraphs in a heading
style are the headings.

A paragraph is a heading of level N when its style, or a style it is based on, is Word's built-in
"Heading N" (Word stores the English built-in name even in a localised Word, where the user sees
e.g. 見出し 1), or when the paragraph sets an outline level itself; "Title" sits above level 1.
Tables are kept in document order, one row a line, cells separated by ' | '. The text of each
paragraph is read from its XML (`docx_text`): text boxes, footnotes and endnotes (after the
paragraph citing them), equations as linear text and tracked insertions are kept; deletions and
comments are left out. A Strict OOXML file (ISO/IEC 29500 Strict namespaces) is read through
its Transitional equivalent (`transitional`).

Why python-docx: it and mammoth kept every character and every heading of the shipped files;
python-docx was 1.4-2.3x faster (see docs/index-and-retrieval.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from residency.corpus.docx_text import (
    M_NS,
    W_NS,
    NoteRefs,
    W,
    iter_blocks,
    read_paragraph,
    table_rows,
)
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


# ISO/IEC 29500 Strict namespaces -> the Transitional ones python-docx reads (ECMA-376 Part 1,
# Annex A); relationship types follow the same prefixes ('.../relationships/officeDocument').
_STRICT = (
    ("http://purl.oclc.org/ooxml/wordprocessingml/main", W_NS),
    ("http://purl.oclc.org/ooxml/officeDocument/math", M_NS),
    (
        "http://purl.oclc.org/ooxml/officeDocument/relationships",
        "http://schemas.openxmlformats.org/officeDocument/2006/relationships",
    ),
    (
        "http://purl.oclc.org/ooxml/officeDocument/extendedProperties",
        "http://schemas.openxmlformats.org/officeDocument/2006/extended-properties",
    ),
    (
        "http://purl.oclc.org/ooxml/officeDocument/sharedTypes",
        "http://schemas.openxmlformats.org/officeDocument/2006/sharedTypes",
    ),
    (
        "http://purl.oclc.org/ooxml/drawingml/wordprocessingDrawing",
        "http://schemas.openxmlformats.org/drawingml/2006/wordprocessingDrawing",
    ),
    ("http://purl.oclc.org/ooxml/drawingml/", "http://schemas.openxmlformats.org/drawingml/2006/"),
)


def transitional(data: bytes) -> bytes | None:
    """A Strict OOXML .docx rewritten with the Transitional namespaces (same text, same
    structure), or None when `data` is not Strict."""
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as src:
        names = src.namelist()
        if "_rels/.rels" not in names or b"purl.oclc.org/ooxml" not in src.read("_rels/.rels"):
            return None
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
            for name in names:
                body = src.read(name)
                if name.endswith((".xml", ".rels")):
                    for strict, usual in _STRICT:
                        body = body.replace(strict.encode(), usual.encode())
                dst.writestr(name, body)
    return out.getvalue()


def _notes(document: Any) -> dict[tuple[str, str], str]:
    """Footnote and endnote texts by (kind, id), separators left out."""
    import lxml.etree

    notes: dict[tuple[str, str], str] = {}
    for rel in document.part.rels.values():
        kind = rel.reltype.rpartition("/")[2].rstrip("s")  # '.../footnotes' -> 'footnote'
        if kind not in ("footnote", "endnote") or rel.is_external:
            continue
        root = lxml.etree.fromstring(rel.target_part.blob)
        for note in root.iter(f"{W}{kind}"):
            if note.get(f"{W}type") in ("separator", "continuationSeparator", "continuationNotice"):
                continue
            texts = [read_paragraph(p, NoteRefs()).text for p in note.iter(f"{W}p")]
            notes[(kind, str(note.get(f"{W}id")))] = " ".join(" ".join(texts).split())
    return notes


def _open(data: bytes) -> tuple[Any, str | None]:
    """(python-docx Document, None) or (None, why it cannot be read)."""
    import io
    import zipfile

    import docx

    try:
        return docx.Document(io.BytesIO(data)), None
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        problem = str(exc)
    try:
        converted = transitional(data)
    except zipfile.BadZipFile:
        converted = None
    if converted is not None:
        try:
            return docx.Document(io.BytesIO(converted)), None
        except (zipfile.BadZipFile, KeyError, ValueError) as exc:
            return None, (
                f"cannot read Strict OOXML DOCX ({exc}): save it from Word as "
                "'Word Document (.docx)' (Transitional) to index it"
            )
    return None, f"cannot read DOCX ({problem}); is it a Word 2007+ .docx (not .doc or encrypted)?"


# One block of the body in order: (heading level or None, text, paragraph number, separator).
_Event = tuple[int | None, str, int, str]


def _drafts(rel: str, events: Sequence[_Event]) -> list[Draft]:
    """The sections the body's blocks make, each heading opening one."""
    builder = DraftBuilder(rel)
    for k, (level, text, n, sep) in enumerate(events):
        following = next((e[0] for e in events[k + 1 :] if e[1]), -1)
        if level is None or (following is not None and following <= level):
            # text, or a heading with no text under it ('A Numbered Header.' alone, a heading
            # right before one of its level): kept as text, never dropped
            builder.body(text, sep=sep or "\n\n")
        else:
            builder.heading(level, text, n)
    return builder.finish()


def read_docx(rel: str, data: bytes) -> tuple[list[Draft], list[SkippedInput]]:
    """Sections of one .docx file (`Draft.line` is the heading's paragraph number)."""
    from docx.text.paragraph import Paragraph as DocxParagraph

    document, problem = _open(data)
    if document is None:
        return [], [SkippedInput(file=rel, line=0, reason=problem or "cannot read DOCX")]
    body = document.element.body
    notes, refs = _notes(document), NoteRefs()
    events: list[_Event] = []
    cited: list[tuple[str, str, str]] = []

    def cell_text(tc: Any) -> str:
        parts: list[str] = []
        for block in iter_blocks(tc):
            if block.tag == f"{W}tbl":
                parts.append(" ; ".join(table_rows(block, cell_text)))
                continue
            paragraph = read_paragraph(block, refs)
            cited.extend(paragraph.notes)
            parts.append(paragraph.text)
            parts += [cell_text(box) for box in paragraph.boxes]
        return " ".join(parts)

    def emit_notes() -> None:
        for kind, note_id, mark in cited:
            if notes.get((kind, note_id)):
                events.append((None, f"[{mark}] {notes[(kind, note_id)]}", 0, "\n"))
        cited.clear()

    def emit(container: Any, headings: bool) -> None:
        for n, block in enumerate(iter_blocks(container), start=1):
            if block.tag == f"{W}tbl":
                events.append((None, "\n".join(table_rows(block, cell_text)), n, "\n\n"))
                emit_notes()
                continue
            paragraph = read_paragraph(block, refs)
            text = paragraph.text.strip()
            level = heading_level(DocxParagraph(block, document)) if headings and text else None
            if level is not None:
                events.append((level, " ".join(text.split()), n, ""))
            elif text:
                events.append((None, text, n, "\n\n"))
            for box in paragraph.boxes:
                emit(box, headings=False)
            cited.extend(paragraph.notes)
            emit_notes()

    emit(body, headings=True)
    drafts = _drafts(rel, events)
    if not drafts:
        return [], [SkippedInput(file=rel, line=0, reason="no text in the document body")]
    return drafts, []
