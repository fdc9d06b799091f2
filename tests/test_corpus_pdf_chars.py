"""The PDF reader's per-line character queries (`pdf_chars.PageChars`, `pdf_layout._line_size`,
`_cells`) against a reference that asks pdfium about every character with fresh ctypes buffers,
on real PDFs (a LaTeX book with formulas and soft hyphens, an invoice with table rows)."""

from __future__ import annotations

import ctypes
import statistics
from pathlib import Path

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pytest

from residency.corpus.pdf_chars import PageChars
from residency.corpus.pdf_layout import CELL_GAP_EMS, _cells, _line_size

FILES = Path(__file__).parent / "real_documents" / "files" / "pdf"


def _reference_size(raw: object, index: int) -> float:
    size = float(pdfium_c.FPDFText_GetFontSize(raw, index))
    matrix = pdfium_c.FS_MATRIX()
    if not pdfium_c.FPDFText_GetMatrix(raw, index, ctypes.byref(matrix)):
        return size
    scale = abs(matrix.a * matrix.d - matrix.b * matrix.c) ** 0.5
    return size * scale if scale > 0 else size


def _reference_box(raw: object, index: int) -> tuple[float, float, float, float]:
    edges = [ctypes.c_double() for _ in range(4)]
    pdfium_c.FPDFText_GetCharBox(raw, index, *(ctypes.byref(e) for e in edges))
    return edges[0].value, edges[1].value, edges[2].value, edges[3].value


def _reference_cells(raw: object, text: str, first: int, last: int, size: float) -> int:
    """Every space after a word, its run's end found character by character."""
    gaps = 0
    for k in range(first + 1, last):
        if text[k].isspace() and not text[k - 1].isspace():
            after = k + 1
            while after < last and text[after].isspace():
                after += 1
            wide = CELL_GAP_EMS * max(size, 1.0)
            gaps += _reference_box(raw, after)[0] - _reference_box(raw, k - 1)[1] > wide
    return gaps + 1


@pytest.mark.parametrize(
    ("name", "pages"),
    [("pypdf-geotopo.pdf", range(28, 32)), ("markitdown-repair-invoice.pdf", range(2))],
    ids=["latex-book-formulas", "invoice-tables"],
)
def test_line_queries_match_asking_every_character(name: str, pages: range) -> None:
    doc = pdfium.PdfDocument((FILES / name).read_bytes())
    checked = sizes_differing = tables = 0
    try:
        for n in pages:
            textpage = doc[n].get_textpage()
            raw, chars = textpage.raw, PageChars(textpage.raw)
            text = textpage.get_text_range(0, textpage.count_chars())
            for start in range(len(text)):
                if text[start].isspace() or (start and not text[start - 1].isspace()):
                    continue  # a word's first character starts the span checked
                last = min(start + 60, len(text) - 1)
                while last > start and text[last].isspace():
                    last -= 1
                middle = (start + last) // 2
                picks = {start, last} | ({middle} if not text[middle].isspace() else set())
                want = statistics.median(_reference_size(raw, i) for i in picks)
                assert _line_size(chars, text, start, last) == want
                assert chars.box(start) == _reference_box(raw, start)
                cells = _cells(chars, text, start, last, want)
                assert cells == _reference_cells(raw, text, start, last, want)
                checked += 1
                sizes_differing += len({_reference_size(raw, i) for i in picks}) > 1
                tables += cells > 1
            textpage.close()
    finally:
        doc.close()
    assert checked > 100
    assert sizes_differing > 0  # the median of three, not the first character's size, was tested
    if name.startswith("markitdown"):
        assert tables > 0  # wide gaps between cells were found


def test_font_names_drop_the_subset_prefix() -> None:
    doc = pdfium.PdfDocument((FILES / "pypdf-geotopo.pdf").read_bytes())
    try:
        textpage = doc[30].get_textpage()
        chars = PageChars(textpage.raw)
        names = {chars.font(i) for i in range(textpage.count_chars())}
        textpage.close()
    finally:
        doc.close()
    assert len(names) > 3  # text, math and heading fonts
    assert not any("+" in name for name in names)
