"""The PDF reader on the layouts real documents have: soft hyphens and control characters, running
headers and page numbers, contents pages, tables, wrong outlines (PDFs written byte by byte in
tests/pdf_maker.py, read by the real pdfium)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest
from pdf_maker import Text, make_pdf

from residency.corpus.drafts import Draft
from residency.corpus.pdf import read_pdf
from residency.corpus.pdf_layout import Line, clean_line, rejoin_hyphens

BAD = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\ufffe\uffff\u00ad]")
BODY = "The lamp is checked every morning before the first train leaves the depot."


def _read(pages: list[list[Text]], outline: Sequence[tuple[str, int]] = ()) -> list[Draft]:
    drafts, skipped = read_pdf("doc.pdf", make_pdf(pages, outline))
    assert skipped == []
    return drafts


def _headings(drafts: list[Draft]) -> list[str]:
    return [d.title.split(" > ")[-1] for d in drafts]


def _all_text(drafts: list[Draft]) -> str:
    return "\n".join(d.title + "\n" + d.text for d in drafts)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Prae\ufffesent nec", "Praesent nec"),  # pdfium joined the lines, marker left inside
        ("proof\x04 box", "proof box"),
        ("brace \x08x", "brace x"),
        ("a\tb", "a b"),
        ("soft\u00adhyphen", "softhyphen"),
    ],
    ids=["ufffe", "eot", "backspace", "tab", "u00ad"],
)
def test_control_characters_and_markers_are_dropped(raw: str, expected: str) -> None:
    assert clean_line(raw) == expected


def test_a_word_split_at_a_line_end_is_made_whole() -> None:
    lines = [Line("Lorem ipsum Prae\u00ad", 10, 1), Line("sent nec odio.", 10, 1)]
    lines += [Line("ending in adip\u00ad", 10, 1), Line("iscing", 10, 2), Line("next", 10, 2)]
    assert [ln.text for ln in rejoin_hyphens(lines)] == [
        "Lorem ipsum Praesent",
        "nec odio.",
        "ending in adipiscing",
        "next",
    ]


def test_a_hyphenated_pdf_has_whole_words_and_no_controls() -> None:
    page = [
        Text(72, 760, 10, "Lorem ipsum dolor sit amet, adip-"),
        Text(72, 748, 10, "iscing elit. A proof box \x04 ends it."),
    ]
    text = _all_text(_read([page]))
    assert "adipiscing elit." in text
    assert BAD.search(text) is None


def _manual(pages: int) -> list[list[Text]]:
    """A manual with a running header, a footer 'Page n of N' and a section on every page."""
    out = []
    for n in range(1, pages + 1):
        out.append(
            [
                Text(72, 800, 8, "ACME Lamp Manual - Operations and Care"),
                Text(72, 740, 16, f"{n} Chapter {'ABCDEF'[n - 1]}", bold=True),
                *(Text(72, 700 - 14 * k, 10, f"{BODY} ({n}.{k})") for k in range(8)),
                Text(270, 40, 8, f"Page {n} of {pages}"),
            ]
        )
    return out


def test_running_headers_and_page_numbers_stay_out_of_sections() -> None:
    drafts = _read(_manual(4))
    assert _headings(drafts) == ["1 Chapter A", "2 Chapter B", "3 Chapter C", "4 Chapter D"]
    text = _all_text(drafts)
    assert "ACME Lamp Manual" not in text
    assert "Page " not in text
    assert text.count(BODY) == 32  # every body line kept


def test_a_page_number_alone_is_furniture_and_a_numbered_heading_is_not() -> None:
    pages = [
        [
            Text(72, 790, 16, f"{n} Section {n}", bold=True),  # at the top, number = page
            *(Text(72, 760 - 14 * k, 10, BODY) for k in range(5)),
            Text(290, 40, 9, f"{n}"),
        ]
        for n in (1, 2, 3)
    ]
    drafts = _read(pages)
    assert _headings(drafts) == ["1 Section 1", "2 Section 2", "3 Section 3"]
    for draft in drafts:
        assert draft.text.count(BODY) == 5
        assert not draft.text.rstrip().endswith(("1", "2", "3"))


def test_contents_entries_are_not_sections() -> None:
    contents = [
        Text(72, 760, 16, "Contents", bold=True),
        Text(72, 730, 10, "1 Introduction . . . . . . . . . . . 2", bold=True),
        Text(72, 716, 10, "1.1 Scope . . . . . . . . . . . . . . 2"),
        Text(72, 702, 10, "2 Daily checks . . . . . . . . . . . 3", bold=True),
        Text(72, 688, 10, "3 Replacing the lamp 3", bold=True),
    ]
    body = [
        Text(72, 760, 16, "1 Introduction", bold=True),
        *(Text(72, 740 - 14 * k, 10, BODY) for k in range(6)),
        Text(72, 640, 12, "1.1 Scope", bold=True),
        *(Text(72, 620 - 14 * k, 10, BODY) for k in range(6)),
    ]
    drafts = _read([contents, body])
    assert _headings(drafts) == ["Contents", "1 Introduction", "1.1 Scope"]
    assert "3 Replacing the lamp 3" in drafts[0].text


def _row(y: float, size: float, *cells: str) -> list[Text]:
    return [Text(72 + 160 * k, y, size, cell) for k, cell in enumerate(cells)]


def test_table_rows_are_never_headings_and_no_page_loses_its_table() -> None:
    """An estimate: a large title, a table set larger than the small print, on both pages."""
    pages = []
    for n in (1, 2):
        rows = [
            *_row(700, 11, "Insured name", f"Client {n}", "Year", "2022"),
            *_row(684, 11, "Claim #", f"SF-100{n}", "Make", "Jeep"),
            *_row(668, 11, "Policy #", "POL-555", "Model", "Grand Cherokee"),
            *_row(652, 11, "Body Labor", "2", "150", "300"),
            *_row(636, 11, "GRAND TOTAL", "", "", f"{n},738"),
        ]
        small = [Text(72, 600 - 10 * k, 8, f"{BODY} {BODY[:40]}") for k in range(6)]
        pages.append([Text(72, 760, 20, "ZAVA AUTO REPAIR", bold=True), *rows, *small])
    drafts = _read(pages)
    assert _headings(drafts) == ["ZAVA AUTO REPAIR", "ZAVA AUTO REPAIR"]
    assert all(len(h) <= 150 for d in drafts for h in d.title.split(" > "))
    text = _all_text(drafts)
    for cell in ("Client 2", "SF-1002", "Grand Cherokee", "2,738", "Client 1", "1,738"):
        assert cell in text
    assert drafts[1].page == 2
    assert "Client 2" in drafts[1].text


def test_a_long_run_of_large_lines_is_text_not_a_title() -> None:
    page = [
        Text(72, 760, 18, "Notice", bold=True),
        *(Text(72, 730 - 20 * k, 14, f"Large print line {k} of the notice.") for k in range(5)),
        *(Text(72, 600 - 12 * k, 9, BODY) for k in range(12)),
    ]
    drafts = _read([page])
    assert _headings(drafts) == ["Notice"]
    assert "Large print line 4" in drafts[0].text


def _outlined_pages() -> list[list[Text]]:
    return [
        [
            Text(72, 760, 16, f"{n} {title}", bold=True),
            *(Text(72, 740 - 14 * k, 10, BODY) for k in range(8)),
        ]
        for n, title in enumerate(("Foo", "Bar", "Baz"), start=1)
    ]


def test_an_outline_whose_titles_are_not_on_its_pages_is_not_trusted() -> None:
    wrong = [("First", 0), ("Fourth", 1), ("Seventh", 2)]
    drafts = _read(_outlined_pages(), wrong)
    assert _headings(drafts) == ["1 Foo", "2 Bar", "3 Baz"]


def test_an_outline_found_on_its_pages_is_used() -> None:
    right = [("Foo", 0), ("Bar", 1), ("Baz", 2)]
    drafts = _read(_outlined_pages(), right)
    assert _headings(drafts) == ["1 Foo", "2 Bar", "3 Baz"]  # the page's numbers kept
    assert [d.page for d in drafts] == [1, 2, 3]


def _drawing_pages() -> list[list[Text]]:
    """A guide whose second page is a drawing: its title is the page's only text."""
    return [
        [
            Text(72, 760, 16, "Line Tool", bold=True),
            *(Text(72, 740 - 14 * k, 10, BODY) for k in range(4)),
        ],
        [Text(72, 760, 16, "Arrow Styles", bold=True)],
        [
            Text(72, 760, 16, "Curves", bold=True),
            *(Text(72, 740 - 14 * k, 10, BODY) for k in range(4)),
        ],
    ]


def test_a_bookmarked_heading_over_a_drawing_keeps_its_section() -> None:
    drafts = _read(_drawing_pages(), [("Line Tool", 0), ("Arrow Styles", 1), ("Curves", 2)])
    assert _headings(drafts) == ["Line Tool", "Arrow Styles", "Curves"]
    assert (drafts[1].text, drafts[1].page) == ("Arrow Styles", 2)
    # told by its size alone, a title with no text under it stays text of the section before
    drafts = _read(_drawing_pages())
    assert _headings(drafts) == ["Line Tool", "Curves"]
    assert drafts[0].text.endswith("\nArrow Styles")


def test_an_outline_title_set_beside_a_button_starts_its_section() -> None:
    pages = _drawing_pages()
    pages[1] = [
        Text(72, 790, 10, "The line tool's last words, run over from page 1."),
        Text(72, 760, 16, "Arrow Styles", bold=True),
        Text(400, 760, 16, "Next Page"),  # a navigation button on the title's line
        *(Text(72, 740 - 14 * k, 10, BODY) for k in range(2)),
    ]
    drafts = _read(pages, [("Line Tool", 0), ("Arrow Styles", 1), ("Curves", 2)])
    assert _headings(drafts) == ["Line Tool", "Arrow Styles", "Curves"]
    assert drafts[1].text.startswith("Arrow Styles Next Page\n" + BODY)
    assert drafts[1].page == 2
    assert drafts[0].text.endswith("run over from page 1.")  # not moved under the new title


def test_a_page_number_is_never_a_heading() -> None:
    page = [
        Text(72, 780, 18, "Membership form", bold=True),
        *(Text(72, 750 - 14 * k, 10, BODY) for k in range(4)),
        Text(72, 680, 14, "page 1 / 1"),
        *(Text(72, 660 - 14 * k, 10, BODY) for k in range(2)),
    ]
    (draft,) = _read([page])
    assert draft.title == "Membership form"
    assert "page 1 / 1" in draft.text


def test_sizes_set_by_the_text_matrix_still_make_headings() -> None:
    page = [
        Text(72, 760, 18, "Arial font", bold=True, scaled=True),
        *(Text(72, 730 - 14 * k, 10, BODY, scaled=True) for k in range(5)),
    ]
    assert _headings(_read([page])) == ["Arial font"]


def test_labels_fields_and_capitals() -> None:
    page = [
        Text(72, 780, 18, "INVENTORY REPORT", bold=True),
        Text(72, 750, 10, "Report ID: SPARSE-2024", bold=True),
        Text(72, 736, 10, "Prepared By: Sarah Martinez", bold=True),
        *(Text(72, 716 - 14 * k, 10, BODY) for k in range(4)),
        Text(72, 640, 10, "Recommendations:", bold=True),
        *(Text(72, 626 - 14 * k, 10, BODY) for k in range(4)),
        Text(72, 560, 10, "RETURN POLICY"),
        Text(72, 546, 10, "Returns within 30 days."),
        *(Text(72, 532 - 14 * k, 10, BODY) for k in range(4)),
        Text(72, 460, 10, "NOTES:", bold=True),  # capitals over a list of notes: text
        Text(72, 446, 10, "*Refers to frames and receivers."),
        Text(72, 420, 14, "*TXN98765202411231432*", bold=True),  # a barcode's digits
        Text(72, 400, 10, "Thank you for shopping!"),
    ]
    drafts = _read([page])
    assert _headings(drafts) == ["INVENTORY REPORT", "Recommendations:", "RETURN POLICY"]
    assert "NOTES:\n*Refers" in drafts[-1].text
    assert "*TXN98765202411231432*\nThank you" in drafts[-1].text
    assert drafts[0].text.startswith("Report ID: SPARSE-2024\nPrepared By: Sarah Martinez")


@pytest.mark.parametrize(
    "pages",
    [
        [[Text(72, 760, 16, "DUMMY PDF FILE", bold=True)]],
        [
            [
                Text(72, 760, 16, "Report", bold=True),
                *(Text(72, 740 - 14 * k, 10, BODY) for k in range(4)),
                Text(72, 600, 10, "Variance Analysis:", bold=True),
                Text(72, 400, 10, "Summary Statistics:", bold=True),
                Text(72, 386, 10, "Critical items: 1"),
            ]
        ],
    ],
    ids=["one-line-pdf", "label-over-a-chart"],
)
def test_a_heading_without_text_under_it_keeps_its_text(pages: list[list[Text]]) -> None:
    text = _all_text(_read(pages))
    for line in pages[0]:
        assert line.text in text


def test_a_letterhead_drawn_last_is_read_first() -> None:
    """An estimate whose producer drew the table first and the letterhead last."""
    page = [
        *(Text(72, 600 - 14 * k, 10, f"{BODY} ({k})") for k in range(6)),
        Text(72, 780, 20, "ZAVA AUTO REPAIR", bold=True),
        Text(72, 750, 10, "Certified Collision Repair"),
    ]
    (draft,) = _read([page])
    assert draft.title == "ZAVA AUTO REPAIR"
    assert draft.text.startswith("Certified Collision Repair\n" + BODY)


def test_a_large_line_ending_in_an_amount_is_a_row() -> None:
    page = [
        Text(72, 780, 18, "Estimate", bold=True),
        *(Text(72, 760 - 12 * k, 9, BODY) for k in range(8)),
        Text(72, 650, 12, "Parts 2,100", bold=True),
        Text(72, 600, 12, "Sales Tax 10.20%", bold=True),
        *(Text(72, 580 - 12 * k, 9, BODY) for k in range(8)),
    ]
    (draft,) = _read([page])
    assert draft.title == "Estimate"
    assert "\nParts 2,100\nSales Tax 10.20%\n" in draft.text


def test_text_set_off_the_page_is_not_read() -> None:
    """A scan whose producer left a label outside the page box: no text layer a reader sees."""
    drafts, skipped = read_pdf("scan.pdf", make_pdf([[Text(72, 900, 12, "Background")]]))
    assert drafts == []
    assert skipped[0].reason.startswith("PDF has no text layer (1 page(s)")
    on_page = _read([[Text(72, 700, 12, "Visible"), Text(72, 900, 12, "Background")]])
    assert _all_text(on_page).strip() == "Visible"


@pytest.mark.parametrize(
    ("rise", "expected"),
    [(4, "S2 lässt sich"), (8, "S 2 lässt sich")],  # pdfium breaks after it, or around it
    ids=["break-after", "break-around"],
)
def test_a_superscript_and_the_text_after_it_stay_on_their_line(rise: int, expected: str) -> None:
    page = [
        Text(72, 760, 10, "Die Kugeloberfläche S"),
        Text(170, 760 + rise, 7, "2"),
        Text(176, 760, 10, "lässt sich verformen."),
        Text(72, 746, 10, "Next line of the paragraph."),
    ]
    (draft,) = _read([page])
    assert draft.text == f"Die Kugeloberfläche {expected} verformen.\nNext line of the paragraph."
