"""Citations: a RAG answer's retrieved passages name their source file and PDF page, in the
prompt and in the answer records (real index over a real PDF, BM25 only: no model needed)."""

from __future__ import annotations

import shutil
from pathlib import Path

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
    expected = [
        f"platex-en.pdf p. {index.section(c.section_id).page_at(c.start_char)}" for c in chunks
    ]
    assert list(cites) == list(dict.fromkeys(expected))
    assert "platex-en.pdf p. 12" in cites  # C.2 Perl Script dstcheck.pl starts on page 12
    prompt = messages[-1]["content"]
    for cite in cites:
        assert f"[source: {cite}]\n" in prompt
    assert retrieved[0] == "platex-en.pdf#c2-perl-script-dstcheckpl"
