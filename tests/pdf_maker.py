"""Small PDFs written byte by byte for the PDF reader's tests: text lines in Helvetica (a standard
font: nothing embedded) at given places and sizes, and an optional outline (bookmarks).

A page is a list of `Text` lines; y is in points from the page's bottom edge (A4: 842 high).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PAGE_WIDTH, PAGE_HEIGHT = 595, 842


@dataclass(frozen=True, slots=True)
class Text:
    """One line of text: where it starts (points), its size, whether it is bold, and whether
    the size is set by the text matrix on a 1 pt font (as some producers do)."""

    x: float
    y: float
    size: float
    text: str
    bold: bool = False
    scaled: bool = False

    def operators(self) -> bytes:
        """The content-stream operators that draw it."""
        font = b"F2" if self.bold else b"F1"
        if self.scaled:
            place = b"/%s 1 Tf %g 0 0 %g %g %g Tm" % (font, self.size, self.size, self.x, self.y)
        else:
            place = b"/%s %g Tf %g %g Td" % (font, self.size, self.x, self.y)
        return b"BT %s (%s) Tj ET\n" % (place, _escape(self.text))


def _escape(text: str) -> bytes:
    raw = text.encode("cp1252")
    return raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")


def make_pdf(pages: list[list[Text]], outline: Sequence[tuple[str, int]] = ()) -> bytes:
    """The PDF's bytes: `pages` of text, and outline entries (title, 0-based page)."""
    objects: list[bytes] = []

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    catalog = add(b"")  # filled in last
    pages_id = add(b"")
    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    bold = add(
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica-Bold /Encoding /WinAnsiEncoding >>"
    )
    page_ids: list[int] = []
    for lines in pages:
        stream = b"".join(t.operators() for t in lines)
        content = add(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
        page_ids.append(
            add(
                b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 %d %d] /Contents %d 0 R "
                b"/Resources << /Font << /F1 %d 0 R /F2 %d 0 R >> >> >>"
                % (pages_id, PAGE_WIDTH, PAGE_HEIGHT, content, font, bold)
            )
        )
    kids = b" ".join(b"%d 0 R" % p for p in page_ids)
    objects[pages_id - 1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, len(page_ids))
    outline_ref = b""
    if outline:
        root = add(b"")
        first = len(objects) + 1
        ids = list(range(first, first + len(outline)))
        for n, (title, page) in enumerate(outline):
            links = b""
            if n > 0:
                links += b" /Prev %d 0 R" % ids[n - 1]
            if n + 1 < len(ids):
                links += b" /Next %d 0 R" % ids[n + 1]
            add(
                b"<< /Title (%s) /Parent %d 0 R /Dest [%d 0 R /XYZ 0 %d 0]%s >>"
                % (_escape(title), root, page_ids[page], PAGE_HEIGHT, links)
            )
        objects[root - 1] = b"<< /Type /Outlines /First %d 0 R /Last %d 0 R /Count %d >>" % (
            ids[0],
            ids[-1],
            len(ids),
        )
        outline_ref = b" /Outlines %d 0 R" % root
    objects[catalog - 1] = b"<< /Type /Catalog /Pages %d 0 R%s >>" % (pages_id, outline_ref)
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for n, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (n, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        catalog,
        xref,
    )
    return bytes(out)
