"""Character queries on one pdfium text page (box, set size, font name), for `pdf_layout`.

Every query is a call into pdfium through ctypes, made per line of a page (a 117-page LaTeX
book has 6,400 lines); what a call costs in Python was most of reading a PDF. So the output
buffers are allocated once per page, the functions looked up once, and a font's name decoded
once per page (`GetFontInfo` fills a buffer; the name repeats across the page's lines).
"""

from __future__ import annotations

import ctypes
from typing import Any


class PageChars:
    """The characters of one text page (`pypdfium2.PdfTextPage.raw`), queried by index."""

    __slots__ = (
        "_edge_refs",
        "_edges",
        "_flags_ref",
        "_get_box",
        "_get_font_info",
        "_get_font_size",
        "_get_matrix",
        "_matrix",
        "_matrix_ref",
        "_name",
        "_names",
        "_raw",
    )

    def __init__(self, raw_textpage: Any) -> None:
        import pypdfium2.raw as pdfium_c

        self._raw = raw_textpage
        self._edges = [ctypes.c_double() for _ in range(4)]
        self._edge_refs = tuple(ctypes.byref(e) for e in self._edges)
        self._matrix = pdfium_c.FS_MATRIX()
        self._matrix_ref = ctypes.byref(self._matrix)
        self._name = ctypes.create_string_buffer(128)
        self._flags_ref = ctypes.byref(ctypes.c_int())
        self._names: dict[bytes, str] = {}
        self._get_box = pdfium_c.FPDFText_GetCharBox
        self._get_font_size = pdfium_c.FPDFText_GetFontSize
        self._get_matrix = pdfium_c.FPDFText_GetMatrix
        self._get_font_info = pdfium_c.FPDFText_GetFontInfo

    def box(self, index: int) -> tuple[float, float, float, float]:
        """(left, right, bottom, top) of one character, in points."""
        self._get_box(self._raw, index, *self._edge_refs)
        left, right, bottom, top = self._edges
        return left.value, right.value, bottom.value, top.value

    def left(self, index: int) -> float:
        """The left edge of one character, in points."""
        self._get_box(self._raw, index, *self._edge_refs)
        return self._edges[0].value

    def right(self, index: int) -> float:
        """The right edge of one character, in points."""
        self._get_box(self._raw, index, *self._edge_refs)
        return self._edges[1].value

    def size(self, index: int) -> float:
        """The size a character is set in, in points: the font size scaled by its text matrix
        (a PDF may set every font at 1 pt and scale it with the matrix, where pdfium's font
        size says 1)."""
        size = float(self._get_font_size(self._raw, index))
        if not self._get_matrix(self._raw, index, self._matrix_ref):
            return size
        m = self._matrix
        scale = abs(m.a * m.d - m.b * m.c) ** 0.5
        return size * scale if scale > 0 else size

    def font(self, index: int) -> str:
        """'LMSans10-Regular' for a character set in 'USBSTC+LMSans10-Regular'."""
        self._get_font_info(self._raw, index, self._name, 128, self._flags_ref)
        raw = self._name.value
        name = self._names.get(raw)
        if name is None:
            name = self._names[raw] = raw.decode("latin-1").rpartition("+")[2]
        return name
