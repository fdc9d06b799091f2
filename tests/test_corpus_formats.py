"""PDF, HTML and DOCX readers on real files nobody here wrote (tests/corpus_files/README.md).

Every heading a person sees on the rendered pages was counted by hand once and is listed below;
at least 95% of them must become sections (or, for a heading directly followed by a subheading,
the parent in the subheadings' title path). The extracted text must keep >= 98% of the
characters of a reference extraction and add no more than 2% (nothing lost or duplicated).
Where a library gets a file wrong, the test names it.
"""

from __future__ import annotations

import html
import re
import unicodedata
import zipfile
from collections import Counter
from pathlib import Path

import lxml.html
import pytest

from residency.corpus.drafts import Draft
from residency.corpus.formats import BINARY_FORMATS, BinaryFormat
from residency.corpus.loader import load_corpus
from residency.corpus.model import Section
from residency.planning.prefix import render_passage
from residency.tokenizer import ApproxTokenizer

FILES = Path(__file__).parent / "corpus_files"

# Headings a person sees, in page order (counted by hand from the rendered pages).
HEADINGS: dict[str, list[str]] = {
    "platex-en.pdf": [
        "About pLaTeX 2ε",
        "1 Introduction to this document",
        "2 About Functions of pLaTeX2e",
        "2.1 About the Format",
        "2.1.1 Version",
        "2.1.2 NFSS2 Commands",
        "2.1.3 Output Routine and Floats",
        "2.2 Classes and Packages",
        "3 Compatibility with Other Formats and Older Versions",
        "3.1 Compatibility with LaTeX2e",
        "3.2 Compatibility with pLaTeX 2.09",
        "3.3 Support for Package `latexrelease'",
        "A docstrip Options",
        "B Documentation of pLaTeX2e sources",
        "C Additional Utility Programs",
        "C.1 Shell Script mkpldoc.sh",
        "C.1.1 Content of mkpldoc.sh",
        "C.2 Perl Script dstcheck.pl",
        "C.3 docstrip Batch file",
        "References",
        "Change History",  # page 16: not in the PDF's outline, so not found (see MISSED)
    ],
    "jieeetran-en.pdf": [
        "jIEEEtran.bst: Unofficial IEEE BibTeX style for Japanese (ver. 0.18)",
        "Abstract",
        "1 Introduction",
        "2 Configuration",
        "3 Combine English and Japanese entries",
    ],
    "bxjaholiday-ja.pdf": [
        "bxjaholiday パッケージ",
        "概要",
        "1 動作要件",
        "2 パッケージ読み込み",
        "3 LaTeX2ε インターフェース",
        "4 expl3 インターフェース",
        "4.1 関数",
        "4.2 変数と定数",
    ],
    "ieejtran-ja.pdf": [
        "IEEJtran.bst: 電気学会非公式 BibTeX スタイル (ver. 0.18)",
        "概要",
        "1 はじめに",
        "2 使用方法",
        "3 カスタマイズ",
        "4 英語と日本語の併記方法",
        "4.1 コンパイル手順",
        "4.2 コンパイラの設定の例",
        "4.3 引用例",
        "参考文献",
    ],
    # Two columns, English | Japanese: a heading row holds both columns' headings, which pdfium
    # sets on one line, so each row is one section ("§ 1 System Requirements § 1 前提条件").
    "asternote.pdf": [
        "The asternote package: annotation symbols enclosed in square brackets and marked with "
        "an asterisk",
        "English 日本語 (Japanese)",
        "§ 1 System Requirements § 1 前提条件",
        "§ 2 Installation § 2 インストール",
        "§ 3 Loading § 3 読み込み",
        "§ 4 Usage § 4 使用方法",
        "§ 5 For More Information § 5 問い合わせ・詳しくは",
    ],
    "gckanbun.pdf": ["gckanbun Package", "概要", "1 gckanbun パッケージの読み込み", "2 例"],
    "itsdangerous-concepts.html": [
        "General Concepts",
        "Serializer vs Signer",
        "The Secret Key",
        "The Salt",
        "Key Rotation",
        "Digest Method Security",
    ],
    "jlreq-trimmarks-ja.html": [
        "jlreq-trimmarks",
        "これは何？",
        "インストール",
        "使い方",
        "ノート",
        "オプション",
        "platex, uplatex, lulatex",
        "dvipdfmx，dvips，dviout",
        "trimmarks_paper",
        "landscape",
        "show",
        "bleed_margin",
        "\\jlreqtrimmarkssetup",
        "banner",
        "trimmarks_width",
        "color",
        "trimmarks_pattern",
        "ライセンス",
        "履歴",
    ],
    "jlreq-en.docx": ["jlreq", "What is this?", "Installation", "Usage", "LICENSE", "CHANGELOG"],
}
MISSED = {"platex-en.pdf": {"Change History"}}  # known misses, each explained above
DOCX_JA_HEADINGS = 50  # jlreq-ja.docx: the h1-h6 of the page it was converted from


def key(text: str) -> str:
    """NFKC, case-folded, letters and digits only ('pLaTeX2e' meets 'pLATEX 2ε')."""
    return "".join(c for c in unicodedata.normalize("NFKC", text).casefold() if c.isalnum())


def found_headings(drafts: list[Draft]) -> set[str]:
    """Every heading that made a section or sits in a section's title path, as keys."""
    return {key(seg) for d in drafts for seg in d.title.split(" > ") if seg}


@pytest.fixture(scope="module")
def sections_of(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Section]]:
    """Each shipped document loaded as a one-file corpus."""
    out: dict[str, list[Section]] = {}
    for name in [*HEADINGS, "jlreq-ja.docx"]:
        root = tmp_path_factory.mktemp(name.replace(".", "-"))
        (root / name).write_bytes((FILES / name).read_bytes())
        corpus = load_corpus(root, ApproxTokenizer())
        assert corpus.skipped == (), corpus.skipped
        out[name] = list(corpus.sections)
    return out


def as_drafts(sections: list[Section]) -> list[Draft]:
    return [Draft(s.id, s.line, s.title, s.text) for s in sections]


@pytest.mark.parametrize("name", list(HEADINGS))
def test_headings_a_person_sees_become_sections(
    name: str, sections_of: dict[str, list[Section]]
) -> None:
    found = found_headings(as_drafts(sections_of[name]))
    missed = {h for h in HEADINGS[name] if key(h) not in found}
    assert missed == MISSED.get(name, set())
    recall = 1 - len(missed) / len(HEADINGS[name])
    assert recall >= 0.95, f"{name}: {recall:.3f} of {len(HEADINGS[name])} headings"


def test_docx_heading_levels_follow_the_styles(sections_of: dict[str, list[Section]]) -> None:
    sections = sections_of["jlreq-ja.docx"]
    heads = found_headings(as_drafts(sections))
    assert len(heads) >= 0.95 * DOCX_JA_HEADINGS
    by_anchor = {s.id.split("#", 1)[1]: s for s in sections}
    # Heading 2 > Heading 3 > Heading 4 in the Word file: the title path nests them.
    assert by_anchor["書式関連"].title == "jlreq > jlreq > 見出し > 別行見出し > 書式関連"
    assert by_anchor["その他-2"].title.endswith("別行見出し > その他")  # 2nd 'その他' in the file


def bag(text: str) -> Counter[str]:
    """Characters that carry text: NFKC, no whitespace, controls or invisible format marks."""
    norm = unicodedata.normalize("NFKC", text)
    return Counter(c for c in norm if unicodedata.category(c)[0] not in "CZ")


# Page furniture the PDF reader keeps out of the text (pdftotext keeps it), read off the pages:
# asternote.pdf's running header 'The asternote package  Yukoh KUSAKABE  n/5' (pdftotext puts its
# three parts on lines of their own)
RUNNING_HEADER = {
    "asternote.pdf": re.compile(r"^(?:The asternote package|Yukoh KUSAKABE|\d/5)$", re.M)
}


def reference_text(name: str) -> str:
    """What the extraction is compared with: pdftotext for PDFs, the page's main element read
    with lxml for HTML, every w:t run of the document XML for DOCX (no reader of ours)."""
    path = FILES / name
    if name.endswith(".pdf"):
        text = (FILES / f"{path.stem}.pdftotext.txt").read_text(encoding="utf-8")
        return RUNNING_HEADER.get(name, re.compile("(?!)")).sub("", text)
    if name.endswith(".docx"):
        xml = zipfile.ZipFile(path).read("word/document.xml").decode("utf-8")
        return html.unescape("".join(re.findall(r"<w:t(?: [^>]*)?>([^<]*)</w:t>", xml)))
    doc = lxml.html.fromstring(path.read_bytes())
    for el in doc.xpath('//a[@class="headerlink"]|//script|//style'):
        el.drop_tree()
    main = doc.xpath('//div[@role="main"]') or doc.xpath("//body")
    return str(main[0].text_content())


@pytest.mark.parametrize("name", [*HEADINGS, "jlreq-ja.docx"])
def test_no_text_lost_or_duplicated(name: str, sections_of: dict[str, list[Section]]) -> None:
    sections = sections_of[name]
    headings = {seg for s in sections for seg in s.title.split(" > ") if seg}
    ours, ref = bag("\n".join([*(s.text for s in sections), *headings])), bag(reference_text(name))
    common = sum((ours & ref).values())
    coverage, precision = common / sum(ref.values()), common / sum(ours.values())
    assert coverage >= 0.98, f"{name}: {coverage:.4f} of the reference's characters kept"
    assert precision >= 0.98, f"{name}: {1 - precision:.4f} of ours not in the reference"


def test_pdf_sections_keep_their_pages_for_citations(
    sections_of: dict[str, list[Section]],
) -> None:
    by_title = {s.title.split(" > ")[-1]: s for s in sections_of["platex-en.pdf"]}
    version = by_title["2.1.1 Version"]
    assert (version.id, version.line, version.page) == ("platex-en.pdf#211-version", 4, 4)
    b = by_title["B Documentation of pLaTeX2e sources"]  # runs from page 7 into page 11
    assert (b.page, len(b.page_breaks)) == (7, 4)
    assert [b.page_at(0), b.page_at(len(b.text) - 1)] == [7, 11]
    assert [b.page_at(b.page_breaks[0] - 1), b.page_at(b.page_breaks[0])] == [7, 8]
    passage = render_passage(b, b.text[b.page_breaks[1] : b.page_breaks[1] + 40], b.page_breaks[1])
    assert passage.startswith(
        "[id: platex-en.pdf#b-documentation-of-platex2e-sources] "
        "B Documentation of pLaTeX2e sources [source: platex-en.pdf p. 9]\n"
    )


def squash(text: str) -> str:
    return "".join(text.split())


def test_two_column_pdf_keeps_each_column_in_reading_order(
    sections_of: dict[str, list[Section]],
) -> None:
    text = squash("\n".join(s.text for s in sections_of["asternote.pdf"]))
    # Each column's paragraph comes out whole: the lines of the other column are not woven in.
    english = "This package can output annotation symbols enclosed in square brackets and marked "
    english += "with an asterisk."
    assert squash(english) in text
    assert (
        squash("このパッケージは，角括弧囲い・アスタリスク付きの注釈記号を出力することができます。")
        in text
    )


def test_vertical_japanese_comes_out_in_reading_order(
    sections_of: dict[str, list[Section]],
) -> None:
    # gckanbun.pdf p. 2 sets a kanbun passage vertically (columns right to left). pdfium gives
    # the characters in reading order, with the small okurigana / kaeriten marks set beside
    # them woven in (自リ二桓公一八世ニシテ...): the base text 自桓公八世至景公 is in order
    # within a short span. (pdftotext's reference reads it across the columns instead.)
    text = squash(next(s.text for s in sections_of["gckanbun.pdf"] if s.title.endswith("2 例")))
    assert re.search("自.{0,3}桓公.{0,3}八世.{0,5}至.{0,3}景公", text)


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        pytest.param("encrypted.pdf", "encrypted PDF (needs a password)", id="encrypted"),
        pytest.param("congress-gray.pdf", "PDF has no text layer (1 page(s)", id="scanned"),
    ],
)
def test_unreadable_pdfs_are_skipped_naming_the_file(
    name: str, fragment: str, tmp_path: Path
) -> None:
    (tmp_path / name).write_bytes((FILES / name).read_bytes())
    (tmp_path / "note.md").write_text("# Note\n\nStill indexed.\n", encoding="utf-8")
    corpus = load_corpus(tmp_path, ApproxTokenizer())
    assert [s.id for s in corpus.sections] == ["note#note"]
    assert [(s.file, s.line) for s in corpus.skipped] == [(name, 0)]
    assert fragment in corpus.skipped[0].reason


def test_html_navigation_chrome_is_dropped(sections_of: dict[str, list[Section]]) -> None:
    sections = sections_of["itsdangerous-concepts.html"]
    text = "\n".join(s.title + "\n" + s.text for s in sections)
    for chrome in ("Quick search", "Navigation", "Table of Contents", "Previous topic", "©"):
        assert chrome not in text
    # Section ids use the page's own heading ids, the links a reader follows.
    assert [s.id.split("#")[1] for s in sections] == [
        "serializer-vs-signer",
        "the-secret-key",
        "the-salt",
        "key-rotation",
        "digest-method-security",
    ]


def test_a_format_whose_library_is_missing_is_skipped_with_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    absent = BinaryFormat("PDF", "residency_no_such_module", "pdf", BINARY_FORMATS[".pdf"].reader)
    monkeypatch.setitem(BINARY_FORMATS, ".pdf", absent)
    (tmp_path / "manual.pdf").write_bytes((FILES / "jieeetran-en.pdf").read_bytes())
    (tmp_path / "note.md").write_text("# Note\n\ntext\n", encoding="utf-8")
    corpus = load_corpus(tmp_path, ApproxTokenizer())
    assert [s.id for s in corpus.sections] == ["note#note"]
    assert corpus.skipped[0].reason == (
        "PDF needs the optional dependency 'residency_no_such_module': pip install 'residency[pdf]'"
    )
