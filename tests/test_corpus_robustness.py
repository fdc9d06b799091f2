"""No single file aborts a run or loses content for an id: odd names, failing readers, colliding
ids, symlink loops, front matter (real files in tmp_path, the CLI as a user runs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from residency_cli import REPO_ROOT

from residency.corpus.clean_text import clean_draft
from residency.corpus.drafts import Draft
from residency.corpus.html import read_html
from residency.corpus.loader import load_corpus
from residency.corpus.markdown import parse_markdown
from residency.index import IndexOptions, build_index
from residency.index.watch import content_changed
from residency.tokenizer import ApproxTokenizer

DOCX = REPO_ROOT / "tests/real_documents/files/docx/mammoth-tables.docx"


def index_cli(corpus: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`residency index` in a child process whose stdout is a pipe, on a 40-column terminal."""
    command = [sys.executable, "-m", "residency", "index", str(corpus), "-o", str(out)]
    return subprocess.run(
        [*command, "--no-dense", *extra],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
        env={**os.environ, "COLUMNS": "40"},
    )


def truncated_docx(path: Path) -> None:
    """A real .docx whose document.xml is cut in half (python-docx's XML parser raises)."""
    with zipfile.ZipFile(DOCX) as src, zipfile.ZipFile(path, "w") as out:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "word/document.xml":
                data = data[: len(data) // 2]
            out.writestr(item, data)


def test_a_file_name_that_is_not_utf8_is_indexed_and_shown_escaped(tmp_path: Path) -> None:
    corpus = tmp_path / "docs"
    corpus.mkdir()
    with open(os.fsencode(corpus) + b"/caf\xe9.md", "wb") as f:
        f.write("# Menu\n\nCafé au lait.\n".encode())
    (corpus / "ok.txt").write_text("Plain note.\n", encoding="utf-8")
    loaded = load_corpus(corpus, ApproxTokenizer())
    assert [(s.file, s.id) for s in loaded.sections] == [
        ("caf\\xe9.md", "caf\\xe9#menu"),
        ("ok.txt", "ok#p1"),
    ]
    out = index_cli(corpus, tmp_path / "idx", "--json")
    assert out.returncode == 0, out.stderr
    assert [f["path"] for f in json.loads(out.stdout)["files"]] == ["caf\\xe9.md", "ok.txt"]


def test_a_reader_that_raises_skips_only_its_file_with_the_whole_reason(tmp_path: Path) -> None:
    corpus = tmp_path / "docs"
    corpus.mkdir()
    truncated_docx(corpus / ("truncated-" + "x" * 60 + ".docx"))
    (corpus / "ok.txt").write_text("Plain note.\n", encoding="utf-8")
    as_json = index_cli(corpus, tmp_path / "idx", "--json")
    assert as_json.returncode == 0, as_json.stderr
    manifest = json.loads(as_json.stdout)
    [skipped] = manifest["skipped"]
    assert skipped["file"] == "truncated-" + "x" * 60 + ".docx"
    assert len(skipped["reason"]) > 40  # the class and the message, not a bare "failed"
    assert manifest["section_count"] == 1
    as_text = index_cli(corpus, tmp_path / "idx2")
    assert as_text.returncode == 0, as_text.stderr
    # off a TTY, on a 40-column terminal: the location and the reason whole, on one line
    assert f"  {skipped['file']}: {skipped['reason']}\n" in as_text.stdout


def test_front_matter_with_an_impossible_date_is_indexed_without_it(tmp_path: Path) -> None:
    drafts, skipped = parse_markdown("log", "---\ndate: 2024-13-45\n---\n# A\n\ntext\n", "log.md")
    assert [d.id for d in drafts] == ["log#a"]
    assert [(s.line, "month must be in 1..12" in s.reason) for s in skipped] == [(1, True)]


def test_same_stem_md_and_txt_are_both_indexed_with_distinct_stable_ids(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("# P1\n\nFrom the Markdown file.\n", encoding="utf-8")
    (tmp_path / "notes.txt").write_text("From the text file.\n", encoding="utf-8")
    first = load_corpus(tmp_path, ApproxTokenizer())
    again = load_corpus(tmp_path, ApproxTokenizer())
    ids = [(s.id, s.file, s.text) for s in first.sections]
    assert ids == [
        ("notes#p1", "notes.md", "From the Markdown file."),
        ("notes#p1-2", "notes.txt", "From the text file."),
    ]
    assert [(s.id, s.file, s.text) for s in again.sections] == ids
    assert [s.reason for s in first.skipped] == [
        "duplicate section id 'notes#p1' (first at notes.md:1): kept as 'notes#p1-2'"
    ]


def test_a_symlink_loop_is_reported_as_skipped(tmp_path: Path) -> None:
    (tmp_path / "real.txt").write_text("Kept.\n", encoding="utf-8")
    (tmp_path / "a.md").symlink_to("b.md")
    (tmp_path / "b.md").symlink_to("a.md")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/up").symlink_to("..")
    loaded = load_corpus(tmp_path, ApproxTokenizer())
    assert [s.id for s in loaded.sections] == ["real#p1"]
    reasons = {s.file: s.reason for s in loaded.skipped}
    assert sorted(reasons) == ["a.md", "b.md", "sub/up"]
    assert "loop" in reasons["a.md"].lower()
    assert "directory, not followed" in reasons["sub/up"]


PAGE = """<html><body><main>
<h1>Lighthouse log</h1><p>Intro.</p>
<div id="content"><h2>Lamp</h2><p>First lamp text.</p></div>
<div id="content"><h2>Lamp</h2><p>Second lamp text.</p></div>
<h2><span id="fog-signal">Fog</span> signal</h2><p>Horn text.</p>
<h2 id="lamp">Lamp again</h2><p>Third lamp text.</p>
</main></body></html>"""


def test_html_heading_ids_are_their_own_and_no_section_is_dropped() -> None:
    drafts, skipped = read_html("log.html", PAGE.encode())
    assert skipped == []
    assert [(d.id, d.text) for d in drafts] == [
        ("log.html#lighthouse-log", "Intro."),
        ("log.html#lamp", "First lamp text."),
        ("log.html#lamp-2", "Second lamp text."),
        ("log.html#fog-signal", "Horn text."),
        ("log.html#lamp-3", "Third lamp text."),
    ]
    assert drafts[1].title == "Lighthouse log > Lamp"


def test_a_results_page_is_a_section_per_result_not_one_preamble() -> None:
    results = "".join(
        f'<li><h2><a href="/r{n}">Result {n}</a></h2><p>Snippet {n}.</p></li>' for n in range(5)
    )
    page = f"<html><body><nav>Menu</nav><main><ol>{results}</ol></main></body></html>"
    drafts, _ = read_html("serp.html", page.encode())
    assert [d.title for d in drafts] == [f"Result {n}" for n in range(5)]
    assert all("Menu" not in d.text for d in drafts)


def test_a_multimarkdown_title_block_is_metadata_not_a_section() -> None:
    text = "Title: Harbour lights\nAuthor: Keeper\n\nFirst paragraph.\n\n# Lamps\n\nLamp text.\n"
    drafts, skipped = parse_markdown("lights", text, "lights.md")
    assert skipped == []
    assert [(d.id, d.title, d.text, d.line) for d in drafts] == [
        ("lights#_preamble", "Harbour lights", "First paragraph.", 4),
        ("lights#lamps", "Lamps", "Lamp text.", 6),
    ]


def test_control_characters_never_reach_the_index(tmp_path: Path) -> None:
    (tmp_path / "crlf.txt").write_bytes(b"Line one\r\nline two\x07\r\n\r\nPage two\x0cafter\r\n")
    (tmp_path / "term.md").write_bytes(b"# Build \x1b[1mlog\x1b[0m\r\n\r\nOK\x08.\r\n")
    (tmp_path / "only.txt").write_bytes(b"\x01\x02\x03\n\nKept.\n")
    loaded = load_corpus(tmp_path, ApproxTokenizer())
    assert [(s.id, s.title, s.text) for s in loaded.sections] == [
        ("crlf#p1", "", "Line one\nline two"),
        ("crlf#p2", "", "Page two\nafter"),
        ("only#p2", "", "Kept."),
        ("term#build-1mlog0m", "Build [1mlog[0m", "OK."),
    ]
    assert [(s.file, s.reason) for s in loaded.skipped] == [
        ("only.txt", "section 'only#p1' holds only control characters")
    ]


def test_a_removed_character_moves_the_page_breaks_with_the_text() -> None:
    draft = Draft("a.pdf#x", 1, "T", "ab\x04cd\ufffeef", page=3, page_breaks=(4, 6))
    cleaned = clean_draft(draft)
    assert (cleaned.text, cleaned.page_breaks) == ("abcdef", (3, 4))
    assert cleaned.text[3] == "d"  # page 4 began at 'd', page 5 at 'e': still so
    assert cleaned.text[4] == "e"


def test_watch_sees_an_escaped_name_as_indexed_not_as_a_change(tmp_path: Path) -> None:
    corpus = tmp_path / "docs"
    corpus.mkdir()
    with open(os.fsencode(corpus) + b"/caf\xe9.md", "wb") as f:
        f.write(b"# Menu\n\nTea.\n")
    manifest = build_index(corpus, tmp_path / "idx", IndexOptions(dense=False), ApproxTokenizer())
    assert [f.path for f in manifest.files] == ["caf\\xe9.md"]
    assert not content_changed(corpus, manifest)
    with open(os.fsencode(corpus) + b"/caf\xe9.md", "ab") as f:
        f.write(b"More tea.\n")
    assert content_changed(corpus, manifest)
