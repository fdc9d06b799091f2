"""The text of a Word document's XML as a reader sees the page: runs, tracked changes, text boxes,
footnote / endnote references and equations.

python-docx's ``Paragraph.text`` reads only the runs directly under a paragraph, so inserted text
(``w:ins``), content controls, text boxes and equations were lost ("For ,  The angle is ."). Here
a paragraph's XML is walked whole:

- kept: ``w:t`` wherever it sits (hyperlinks, ``w:ins``, ``w:sdt``, smart tags, fields' results);
  tabs become spaces, breaks newlines;
- dropped: deleted and moved-away text (``w:del``, ``w:moveFrom``), field codes, comments (only
  their reference marks are in the paragraph), the ``mc:Fallback`` copy of a text box or drawing
  (its ``mc:Choice`` is read, so a text box is read once), ruby (furigana) readings over their
  base text (``w:rt``: '漢字', not 'かんじ漢字'), Word's table of contents (a content control);
- a text box (``w:txbxContent``) is read as paragraphs of its own, placed after its anchor's;
- a footnote / endnote reference leaves its mark, '[1]' / '[i]', and the note's text follows the
  paragraph as '[1] The note.';
- an equation (OMML ``m:oMath``) becomes linear text: fractions '(a+b)/2', 'x_i', 'x^2', '√(x)',
  'root(3, x)', n-ary operators '∑_(i=1)^n x_i', delimiters '(x, y)', functions 'sin x'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
M_NS = "http://schemas.openxmlformats.org/officeDocument/2006/math"
MC_NS = "http://schemas.openxmlformats.org/markup-compatibility/2006"
W = f"{{{W_NS}}}"
M = f"{{{M_NS}}}"
_SKIP = {f"{W}{t}" for t in ("pPr", "rPr", "del", "moveFrom", "instrText", "delText", "tblPr")}
_SKIP |= {f"{{{MC_NS}}}Fallback", f"{W}commentReference", f"{W}sectPr", f"{W}rt"}
# U+2061 FUNCTION APPLICATION reads as a space ('sin θ'); invisible times / separator / plus go
_INVISIBLE = {0x2061: " ", 0x2062: None, 0x2063: None, 0x2064: None}
_ROMAN = [(10, "x"), (9, "ix"), (5, "v"), (4, "iv"), (1, "i")]


def roman(n: int) -> str:
    """'iv' for 4 (Word numbers endnotes i, ii, iii, ...)."""
    out = ""
    for value, letters in _ROMAN:
        while n >= value:
            out, n = out + letters, n - value
    return out


@dataclass(slots=True)
class NoteRefs:
    """Footnote / endnote ids in the order the text cites them, with the mark each got."""

    marks: dict[tuple[str, str], str] = field(default_factory=dict)  # (kind, id) -> mark

    def mark(self, kind: str, note_id: str) -> str:
        """'1', '2', ... for footnotes, 'i', 'ii', ... for endnotes, once per note."""
        key = (kind, note_id)
        if key not in self.marks:
            n = 1 + sum(1 for k, _ in self.marks if k == kind)
            self.marks[key] = str(n) if kind == "footnote" else roman(n)
        return self.marks[key]


@dataclass(slots=True)
class Paragraph:
    """One paragraph's text, the text boxes anchored in it and the notes it cites (in order)."""

    text: str = ""
    boxes: list[Any] = field(default_factory=list)  # w:txbxContent elements
    notes: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, id, mark)


def read_paragraph(p: Any, refs: NoteRefs) -> Paragraph:
    """The text of one w:p (see the module docstring for what is kept)."""
    out = Paragraph()
    parts: list[str] = []

    def walk(el: Any) -> None:
        for child in el:
            tag = child.tag
            if not isinstance(tag, str) or tag in _SKIP:
                continue
            if tag == f"{W}t":
                parts.append(child.text or "")
            elif tag in (f"{W}tab", f"{W}ptab"):
                parts.append(" ")
            elif tag in (f"{W}br", f"{W}cr"):
                parts.append("\n")
            elif tag == f"{W}noBreakHyphen":
                parts.append("-")
            elif tag in (f"{W}footnoteReference", f"{W}endnoteReference"):
                kind = "footnote" if tag == f"{W}footnoteReference" else "endnote"
                note_id = child.get(f"{W}id", "")
                mark = refs.mark(kind, note_id)
                parts.append(f"[{mark}]")
                out.notes.append((kind, note_id, mark))
            elif tag == f"{W}txbxContent":
                out.boxes.append(child)
            elif tag == f"{M}oMath":
                parts.append(omml_text(child))
            else:
                walk(child)

    walk(p)
    out.text = "".join(parts)
    return out


def iter_blocks(container: Any) -> Iterator[Any]:
    """The w:p and w:tbl elements of a body, cell, note or text box, in order, looking through
    content controls, custom XML and tracked-insertion wrappers."""
    for child in container:
        tag = child.tag
        if tag in (f"{W}p", f"{W}tbl"):
            yield child
        elif tag == f"{W}sdt" and _is_contents(child):
            continue  # Word's table of contents: the headings themselves follow
        elif tag in (f"{W}sdt", f"{W}sdtContent", f"{W}customXml", f"{W}ins"):
            yield from iter_blocks(child)


def _is_contents(sdt: Any) -> bool:
    """Whether a content control is Word's table of contents (its entries end in page
    numbers and repeat the headings)."""
    gallery = sdt.find(f"{W}sdtPr/{W}docPartObj/{W}docPartGallery")
    return gallery is not None and gallery.get(f"{W}val") == "Table of Contents"


def table_rows(tbl: Any, cell_text: Callable[[Any], str]) -> list[str]:
    """A table's rows, cells joined by ' | ' (a merged cell once), empty rows left out."""
    rows: list[str] = []
    for tr in tbl.iter(f"{W}tr"):
        if tr.getparent() is not tbl and tr.getparent().getparent() is not tbl:
            continue  # a nested table's row: read with its cell
        cells = [" ".join(cell_text(tc).split()) for tc in tr.iter(f"{W}tc") if _owned(tc, tr)]
        if any(cells):
            rows.append(" | ".join(cells))
    return rows


def _owned(tc: Any, tr: Any) -> bool:
    parent = tc.getparent()
    while parent is not None and parent is not tr:
        if parent.tag == f"{W}tbl":
            return False
        parent = parent.getparent()
    return parent is tr


# OMML -> linear text ---------------------------------------------------------------------------


def _m(el: Any, name: str) -> Any:
    return el.find(f"{M}{name}")


def _val(el: Any, path: str, default: str) -> str:
    found = el.find(path)
    if found is None:
        return default
    return str(found.get(f"{M}val", default))


def _group(text: str) -> str:
    """'x' stays 'x', 'a+b' becomes '(a+b)': what a sub-/superscript or fraction part needs."""
    text = text.strip()
    if len(text) <= 1 or text.isalnum() or (text[0] + text[-1]) in ("()", "[]", "{}"):
        return text
    return f"({text})"


def omml_text(el: Any) -> str:
    """Linear text of an OMML element (m:oMath or any part of it)."""
    if el is None:
        return ""
    tag = el.tag
    if tag == f"{M}r":
        text = "".join(t.text or "" for t in el.iter(f"{M}t", f"{W}t"))
        return text.translate(_INVISIBLE)
    if tag == f"{M}f":
        return f"{_group(omml_text(_m(el, 'num')))}/{_group(omml_text(_m(el, 'den')))}"
    if tag in (f"{M}sSub", f"{M}sSup", f"{M}sSubSup", f"{M}sPre"):
        base = omml_text(_m(el, "e"))
        sub, sup = _m(el, "sub"), _m(el, "sup")
        scripts = (f"_{_group(omml_text(sub))}" if sub is not None else "") + (
            f"^{_group(omml_text(sup))}" if sup is not None else ""
        )
        return scripts + base if tag == f"{M}sPre" else base + scripts
    if tag == f"{M}rad":
        degree = omml_text(_m(el, "deg")).strip()
        body = omml_text(_m(el, "e"))
        return f"root({degree}, {body})" if degree else f"√({body})"
    if tag == f"{M}nary":
        op = _val(el, f"{M}naryPr/{M}chr", "∫")
        sub, sup = omml_text(_m(el, "sub")).strip(), omml_text(_m(el, "sup")).strip()
        scripts = (f"_{_group(sub)}" if sub else "") + (f"^{_group(sup)}" if sup else "")
        return f"{op}{scripts} {omml_text(_m(el, 'e'))}"
    if tag == f"{M}d":
        begin = _val(el, f"{M}dPr/{M}begChr", "(")
        end = _val(el, f"{M}dPr/{M}endChr", ")")
        sep = _val(el, f"{M}dPr/{M}sepChr", "|")
        inner = (sep if sep == "|" else f"{sep} ").join(omml_text(e) for e in el.findall(f"{M}e"))
        return f"{begin}{inner}{end}"
    if tag == f"{M}func":
        return f"{omml_text(_m(el, 'fName')).strip()} {omml_text(_m(el, 'e'))}"
    if tag in (f"{M}limLow", f"{M}limUpp"):
        mark = "_" if tag == f"{M}limLow" else "^"
        return f"{omml_text(_m(el, 'e'))}{mark}{_group(omml_text(_m(el, 'lim')))}"
    if tag == f"{M}eqArr":
        return "; ".join(omml_text(e) for e in el.findall(f"{M}e"))
    if tag == f"{M}m":
        rows = [", ".join(omml_text(e) for e in mr.findall(f"{M}e")) for mr in el.findall(f"{M}mr")]
        return "[" + "; ".join(rows) + "]"
    if isinstance(tag, str) and tag.endswith("Pr") and tag.startswith(M):
        return ""  # properties (m:fPr, m:naryPr, ...): read above where they matter
    return "".join(omml_text(child) for child in el)
