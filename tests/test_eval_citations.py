"""Citations: a RAG answer's retrieved passages name their source file and PDF page, in the
prompt and in the answer records (real index over a real PDF, BM25 only: no model needed)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from residency.corpus.model import Section
from residency.eval.answers.generate import RagStrategy
from residency.index import IndexOptions, build_index, open_index
from residency.tokenizer import ApproxTokenizer

FILES = Path(__file__).parent / "corpus_files"


def test_rag_passages_and_records_cite_file_and_page(tmp_path: Path) -> None:
    corpus = tmp_path / "docs"
    corpus.mkdir()
    shutil.copy(FILES / "platex-en.pdf", corpus / "platex-en.pdf")
    (corpus / "log.jsonl").write_text('{"id": "n1", "text": "Lamp replaced."}\n', "utf-8")
    build_index(corpus, tmp_path / "idx", IndexOptions(dense=False), ApproxTokenizer())
    index = open_index(tmp_path / "idx")
    rag = RagStrategy(index, generator=None, k=3, max_tokens=8)  # type: ignore[arg-type]
    messages, retrieved, _, cites = rag.messages("Perl script dstcheck.pl")
    hits = index.search_chunks("Perl script dstcheck.pl", 3)
    chunks = [index.chunk(h.id) for h in hits]
    expected = [index.section(c.section_id).cite(c.start_char, c.end_char) for c in chunks]
    assert list(cites) == list(dict.fromkeys(expected))
    assert "platex-en.pdf p. 12" in cites  # C.2 Perl Script dstcheck.pl starts on page 12
    prompt = messages[-1]["content"]
    for cite in cites:
        assert f"[source: {cite}]\n" in prompt
    assert retrieved[0] == "platex-en.pdf#c2-perl-script-dstcheckpl"


def _section(
    file: str, sid: str, text: str, page: int | None = None, breaks: tuple[int, ...] = ()
) -> Section:
    return Section(
        id=sid,
        file=file,
        line=3,
        title="",
        text=text,
        page=page,
        page_breaks=breaks,
        order=0,
        token_count=1,
    )


# 'aaaa\nbbbb\ncccc' on pages 4, 5, 6: page 5 begins at offset 5, page 6 at offset 10
PAGED = _section("m.pdf", "m.pdf#usage", "aaaa\nbbbb\ncccc", page=4, breaks=(5, 10))


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (0, 4, "m.pdf p. 4"),  # the section's own first page
        (5, 9, "m.pdf p. 5"),  # a chunk of page 5 cites page 5, not the section's page 4
        (4, 9, "m.pdf p. 5"),  # the newline before the break is not text on page 4
        (2, 12, "m.pdf pp. 4-6"),  # over two breaks: the range
        (10, None, "m.pdf p. 6"),
    ],
    ids=["first-page", "later-page", "leading-space", "range", "to-end"],
)
def test_a_pdf_passage_cites_the_pages_its_text_is_on(
    start: int, end: int | None, expected: str
) -> None:
    assert PAGED.cite(start, end) == expected


@pytest.mark.parametrize(
    ("file", "sid", "expected"),
    [
        ("guide/setup.md", "guide/setup#install-the-lamp", "guide/setup.md#install-the-lamp"),
        ("site/page.html", "site/page.html#faq-2", "site/page.html#faq-2"),
        ("guide/setup.md", "guide/setup#_preamble", "guide/setup.md"),
        ("notes/log.jsonl", "n1", "notes/log.jsonl:3"),
        ("report.docx", "report.docx#results", "report.docx"),
    ],
    ids=["markdown", "html", "preamble", "jsonl", "docx"],
)
def test_html_and_markdown_passages_cite_the_heading_anchor(
    file: str, sid: str, expected: str
) -> None:
    assert _section(file, sid, "text").cite() == expected


def test_pdf_chunks_cite_their_own_pages_not_their_sections(tmp_path: Path) -> None:
    """platex-en.pdf, a real index: every chunk cites pages within the ones its text is on, a
    chunk over a page break cites the range, and a later chunk of a long section cites a page
    after the one the section starts on."""
    corpus = tmp_path / "docs"
    corpus.mkdir()
    shutil.copy(FILES / "platex-en.pdf", corpus / "platex-en.pdf")
    build_index(corpus, tmp_path / "idx", IndexOptions(dense=False), ApproxTokenizer())
    index = open_index(tmp_path / "idx")
    cites: list[str] = []
    later_page = False
    for section in index.sections:
        for chunk in index.chunks_of(section.id):
            cite = section.cite(chunk.start_char, chunk.end_char)
            first, last = section.page_at(chunk.start_char), section.page_at(chunk.end_char - 1)
            assert cite in (
                f"platex-en.pdf p. {first}",
                f"platex-en.pdf p. {last}",
                f"platex-en.pdf pp. {first}-{last}",
            )
            later_page |= cite == f"platex-en.pdf p. {last}" and last != section.page
            cites.append(cite)
    assert any(" pp. " in c for c in cites)
    assert later_page
