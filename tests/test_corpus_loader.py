"""Corpus loading: section ids, titles, bad-input policy and token counts, on real files."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from vllm_server import VllmServer

from residency.corpus.loader import load_corpus, slugify
from residency.corpus.text_files import scan_file, text_lines
from residency.errors import ConfigError, CorpusError
from residency.tokenizer import (
    ApproxTokenizer,
    LocalTokenizer,
    ServerTokenizer,
    open_tokenizer,
)

MANUAL = """\
前書きの文。

# 運用マニュアル {#operations}

概要の本文。

## 灯器の日常点検 {#lamp-daily-check}

毎日点検する。

## 記録（様式 M-1）

記録を残す。

```
# これは見出しではない
```

### 記録（様式 M-1）

同じ見出し。

## Step 2: Replace the LAMP!

英語の見出し。

## 空の見出し

## 最後 ##

終わり。
"""


def write(root: Path, rel: str, content: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def jsonl(*records: object) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    write(root, "manual/operations.md", MANUAL)
    write(root, "notes/log.txt", "一段落目の\n二行目。\n\n\n二段落目。\n")
    write(
        root,
        "notes/maintenance.jsonl",
        jsonl(
            {
                "id": "note-1",
                "title": "灯台の点検",
                "date": "2025-01-03",
                "tags": ["a", "b"],
                "source": "保守日誌",
                "text": "点検した。",
                "extra": 1,
            },
            {"id": "note-2", "text": "日付なし。"},
        ),
    )
    return root


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        pytest.param("灯器の日常点検（月例）", "灯器の日常点検月例", id="cjk-punctuation-dropped"),
        pytest.param("Step 2: Replace the LAMP!", "step-2-replace-the-lamp", id="ascii"),
        pytest.param("ＦＵＬＬ　ｗｉｄｔｈ", "full-width", id="nfkc"),
        pytest.param("a  -  b", "a-b", id="hyphen-runs-collapse"),
        pytest.param("カタカナ・ひらがな ー", "カタカナひらがな-ー", id="kana-kept"),
        pytest.param("!!!", "section", id="only-punctuation"),
    ],
)
def test_slugify(heading: str, slug: str) -> None:
    assert slugify(heading) == slug


def test_markdown_sections_ids_titles_and_lines(corpus: Path) -> None:
    loaded = load_corpus(corpus, ApproxTokenizer())
    md = [s for s in loaded.sections if s.file == "manual/operations.md"]
    assert [(s.id, s.title, s.line) for s in md] == [
        ("manual/operations#_preamble", "", 1),
        ("manual/operations#operations", "運用マニュアル", 3),
        ("manual/operations#lamp-daily-check", "運用マニュアル > 灯器の日常点検", 7),
        ("manual/operations#記録様式-m-1", "運用マニュアル > 記録（様式 M-1）", 11),
        (
            "manual/operations#記録様式-m-1-2",
            "運用マニュアル > 記録（様式 M-1） > 記録（様式 M-1）",
            19,
        ),
        (
            "manual/operations#step-2-replace-the-lamp",
            "運用マニュアル > Step 2: Replace the LAMP!",
            23,
        ),
        ("manual/operations#最後", "運用マニュアル > 最後", 29),
    ]
    fenced = md[3]
    assert "# これは見出しではない" in fenced.text  # a heading inside a code fence is text
    assert md[2].text == "毎日点検する。"


def test_txt_paragraphs_and_jsonl_records(corpus: Path) -> None:
    loaded = load_corpus(corpus, ApproxTokenizer())
    by_id = {s.id: s for s in loaded.sections}
    assert by_id["notes/log#p1"].text == "一段落目の\n二行目。"
    assert by_id["notes/log#p2"].line == 5
    note = by_id["note-1"]
    assert (note.title, note.date, note.tags, note.source, note.line) == (
        "灯台の点検",
        dt.date(2025, 1, 3),
        ("a", "b"),
        "保守日誌",
        1,
    )
    assert (by_id["note-2"].date, by_id["note-2"].title) == (None, "")
    # corpus order: files sorted by relative path, sections in file order
    assert [s.order for s in loaded.sections] == list(range(len(loaded.sections)))
    assert [s.file for s in loaded.sections] == sorted(s.file for s in loaded.sections)
    assert loaded.skipped == ()


def test_ids_are_stable_across_reloads_and_unrelated_edits(corpus: Path) -> None:
    first = load_corpus(corpus, ApproxTokenizer())
    again = load_corpus(corpus, ApproxTokenizer())
    assert [s.id for s in first.sections] == [s.id for s in again.sections]
    assert first.corpus_hash == again.corpus_hash
    path = corpus / "manual/operations.md"
    path.write_text(MANUAL.replace("毎日点検する。", "毎日、朝に点検する。"), encoding="utf-8")
    edited = load_corpus(corpus, ApproxTokenizer())
    assert [s.id for s in edited.sections] == [s.id for s in first.sections]
    assert edited.corpus_hash != first.corpus_hash
    changed = {f.path for f in edited.files} - {
        f.path for f in edited.files if f in set(first.files)
    }
    assert changed == {"manual/operations.md"}


@pytest.mark.parametrize(
    ("rel", "content", "line", "fragment"),
    [
        pytest.param("empty.md", "  \n\n", 0, "empty file", id="empty"),
        pytest.param("blob.txt", b"\x89PNG\r\n\x1a\n\x00\x00", 0, "binary", id="binary"),
        pytest.param("sjis.txt", "一行目\n灯台".encode("shift_jis"), 1, "not UTF-8", id="non-utf8"),
        pytest.param("slides.pptx", b"PK\x03\x04", 0, "unsupported file type '.pptx'", id="pptx"),
        pytest.param("broken.pdf", b"%PDF-1.4", 0, "cannot read PDF", id="broken-pdf"),
        pytest.param("only-headings.md", "# A\n## B\n", 0, "no section text", id="headings"),
        pytest.param(
            "bad.jsonl",
            '{"id": "x", "text": "ok"}\n{"id": "y", "text": \n',
            2,
            "invalid JSON",
            id="invalid-json",
        ),
        pytest.param("bad.jsonl", '{"id": "x"}\n', 1, "text: Field required", id="no-text"),
        pytest.param("bad.jsonl", '{"text": "t"}\n', 1, "id: Field required", id="no-id"),
        pytest.param("bad.jsonl", '["a"]\n', 1, "expected a JSON object", id="not-object"),
        pytest.param(
            "bad.jsonl",
            '{"id": "x", "text": "t", "date": "2025/01/02"}\n',
            1,
            "date",
            id="date-format",
        ),
        pytest.param(
            "bad.jsonl",
            '{"id": "x", "text": "t", "date": "2025-02-30"}\n',
            1,
            "date",
            id="impossible-date",
        ),
        pytest.param("bad.jsonl", '{"id": "x", "text": "   "}\n', 1, "text", id="blank-text"),
    ],
)
def test_bad_inputs_are_skipped_with_file_line_and_reason(
    corpus: Path, rel: str, content: str | bytes, line: int, fragment: str
) -> None:
    write(corpus, rel, content)
    loaded = load_corpus(corpus, ApproxTokenizer())
    assert len(loaded.skipped) == 1
    skipped = loaded.skipped[0]
    assert (skipped.file, skipped.line) == (rel, line)
    assert fragment in skipped.reason
    assert len(loaded.sections) >= 11  # the rest is still indexed
    assert rel in {f.path for f in loaded.files}  # and the file is part of the corpus hash


def test_duplicate_ids_get_a_suffix_and_keep_their_content(corpus: Path) -> None:
    write(corpus, "z.jsonl", jsonl({"id": "note-1", "text": "二番目"}))
    write(corpus, "dup.md", "# A {#same}\n\n本文1\n\n# B {#same}\n\n本文2\n")
    loaded = load_corpus(corpus, ApproxTokenizer())
    reasons = {(s.file, s.line): s.reason for s in loaded.skipped}
    assert reasons == {
        ("z.jsonl", 1): "duplicate section id 'note-1' (first at notes/maintenance.jsonl:1): "
        "kept as 'note-1-2'",
    }
    text = {s.id: s.text for s in loaded.sections}
    assert text["note-1"] == "点検した。"
    assert text["note-1-2"] == "二番目"
    assert (text["dup#same"], text["dup#same-2"]) == ("本文1", "本文2")


def test_hidden_files_are_not_corpus(corpus: Path) -> None:
    write(corpus, ".git/config", "[core]")
    write(corpus, ".DS_Store", b"\x00\x01")
    loaded = load_corpus(corpus, ApproxTokenizer())
    assert not any(f.path.startswith(".") for f in loaded.files)
    assert loaded.skipped == ()


@pytest.mark.parametrize(
    "files",
    [
        pytest.param({}, id="no-files"),
        pytest.param({"a.md": "", "b.jsonl": "{bad\n"}, id="only-bad-files"),
    ],
)
def test_a_corpus_without_sections_is_an_error(tmp_path: Path, files: dict[str, str]) -> None:
    for rel, content in files.items():
        write(tmp_path, rel, content)
    with pytest.raises(CorpusError, match="has no sections"):
        load_corpus(tmp_path, ApproxTokenizer())


def test_missing_corpus_dir_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_corpus(tmp_path / "nope", ApproxTokenizer())


def test_approx_counts_are_utf8_bytes_over_3_and_labelled(corpus: Path) -> None:
    counter = ApproxTokenizer()
    assert counter.count_batch(["点検した。", "abcd", ""]) == [5, 2, 0]  # 15 bytes, 4 bytes, 0
    assert counter.info.method == "approx"
    assert counter.encode("点検した。") is None  # no ids without a tokenizer
    loaded = load_corpus(corpus, counter)
    note = next(s for s in loaded.sections if s.id == "note-1")
    assert note.token_count == 5


@pytest.fixture
def word_tokenizer_dir(tmp_path: Path) -> Path:
    """A real tokenizer.json: whitespace words, a tiny vocabulary with [UNK]."""
    vocab = {"[UNK]": 0, "灯台": 1, "の": 2, "点検": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = tmp_path / "model"
    out.mkdir()
    tok.save(str(out / "tokenizer.json"))
    return out


def test_local_tokenizer_counts_with_tokenizer_json(word_tokenizer_dir: Path) -> None:
    counter = open_tokenizer(word_tokenizer_dir, None)
    assert isinstance(counter, LocalTokenizer)
    assert counter.count_batch(["灯台 の 点検", "未知 の 語 です", ""]) == [3, 4, 0]
    assert counter.encode("灯台 の 点検") == [1, 2, 3]
    assert counter.info.method == "tokenizer"
    assert len(counter.info.fingerprint or "") == 64


@pytest.mark.parametrize(
    ("tokenizer_dir", "server", "fragment"),
    [
        pytest.param("empty", None, "no tokenizer.json", id="dir-without-tokenizer"),
        pytest.param("empty", "http://127.0.0.1:9", "pass one", id="both"),
    ],
)
def test_token_counter_flag_errors(
    tmp_path: Path, tokenizer_dir: str, server: str | None, fragment: str
) -> None:
    (tmp_path / tokenizer_dir).mkdir()
    with pytest.raises(ConfigError, match=fragment):
        open_tokenizer(tmp_path / tokenizer_dir, server)


@pytest.mark.vllm
def test_server_counts_equal_the_local_tokenizer(
    vllm_dense_server: VllmServer, dense_model_dir: Path
) -> None:
    texts = ["神崎灯台の主灯断の警報が出ました。", "LED lantern LX-300", "灯"]
    server = ServerTokenizer(vllm_dense_server.base_url)
    try:
        local = LocalTokenizer(dense_model_dir)
        assert server.count_batch(texts) == local.count_batch(texts)
        assert [server.encode(t) for t in texts] == [local.encode(t) for t in texts]
        assert server.info.method == "server"
    finally:
        server.close()


def test_a_section_over_the_limit_is_skipped_with_its_file_and_size(tmp_path: Path) -> None:
    from residency.corpus.model import MAX_SECTION_CHARS

    (tmp_path / "ok.md").write_text("# Title\n\nSome text.\n", "utf-8")
    (tmp_path / "huge.txt").write_text("word " * (MAX_SECTION_CHARS // 5 + 10), "utf-8")
    corpus = load_corpus(tmp_path, ApproxTokenizer())
    assert [s.id for s in corpus.sections] == ["ok#title"]
    (skipped,) = corpus.skipped
    assert skipped.file == "huge.txt"
    assert f"{MAX_SECTION_CHARS:,}" in skipped.reason
    assert f"{(tmp_path / 'huge.txt').stat().st_size:,} bytes" in skipped.reason


def test_txt_lines_are_cut_where_splitlines_cuts_them(tmp_path: Path) -> None:
    # A BOM, CRLF, a blank line of spaces and a tab, U+2028 and a lone CR inside a paragraph,
    # a paragraph of an ideographic space (no text once stripped: no section), no final newline.
    text = "\ufeffFirst para\r\nline two\r\n\r\n  \t\r\nthird\u2028same\rstill\n\n\n\u3000\n\nlast"
    (tmp_path / "notes.txt").write_bytes(text.encode("utf-8"))
    corpus = load_corpus(tmp_path, ApproxTokenizer())
    assert [(s.id, s.line, s.text) for s in corpus.sections] == [
        ("notes#p1", 1, "First para\nline two"),
        ("notes#p2", 5, "third\nsame\nstill"),
        ("notes#p3", 12, "last"),
    ]
    assert corpus.skipped == ()


@pytest.mark.parametrize("block_bytes", [pytest.param(8 << 20, id="one-block"), 1, 2, 3, 5])
@pytest.mark.parametrize(
    ("data", "offset", "line", "byte"),
    [
        pytest.param("ab\néé\nx".encode() + b"\xff", 9, 3, 0xFF, id="bad-byte"),
        pytest.param(b"\xef\xbb\xbfab\n\xc3", 6, 2, 0xC3, id="bom-then-truncated"),
        pytest.param(b"ab\n" + b"\xe3\x81\n", 3, 2, 0xE3, id="cut-sequence"),
    ],
)
def test_a_non_utf8_file_names_the_byte_its_offset_and_line(
    tmp_path: Path, block_bytes: int, data: bytes, offset: int, line: int, byte: int
) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(data)
    scan = scan_file(path, text=True, block_bytes=block_bytes)
    assert scan.problem == f"not UTF-8 (byte {byte:#04x} at offset {offset}); re-save as UTF-8"
    assert (scan.line, scan.size_bytes) == (line, len(data))
    assert scan.sha256 == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("block_bytes", [1, 4, 8 << 20])
@pytest.mark.parametrize(
    ("data", "problem"),
    [
        pytest.param("灯台\n".encode(), None, id="utf8"),
        pytest.param(b"\xef\xbb\xbf \n\t\xe3\x80\x80\n", "empty file", id="bom-and-spaces"),
        pytest.param(b"x" * 9000 + b"\x00", None, id="nul-after-8k"),
        pytest.param(b"ab\x00cd", "binary file (NUL bytes); not text", id="nul"),
    ],
)
def test_scan_finds_text_blank_and_binary_files(
    tmp_path: Path, block_bytes: int, data: bytes, problem: str | None
) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    assert scan_file(path, text=True, block_bytes=block_bytes).problem == problem


def test_a_paragraph_over_the_limit_is_skipped_and_the_next_keeps_its_number(
    tmp_path: Path,
) -> None:
    from residency.corpus.model import MAX_SECTION_CHARS

    long = "w" + " word" * (MAX_SECTION_CHARS // 5)  # one character over the limit
    (tmp_path / "notes.txt").write_text(f"before\n\n{long}\n\nafter\n", "utf-8")
    corpus = load_corpus(tmp_path, ApproxTokenizer())
    assert [(s.id, s.line) for s in corpus.sections] == [("notes#p1", 1), ("notes#p3", 5)]
    (skipped,) = corpus.skipped
    assert (skipped.file, skipped.line) == ("notes.txt", 3)
    assert f"'notes#p2' holds {MAX_SECTION_CHARS + 1:,} characters" in skipped.reason


@pytest.mark.parametrize("block_bytes", [1, 2, 3, 7, 1 << 20])
def test_text_lines_read_in_blocks_equal_splitlines_of_the_whole_text(
    tmp_path: Path, block_bytes: int
) -> None:
    pieces = ["a", "é", "灯", "\n", "\r", "\r\n", "\u2028", "\x0b", "\x85", " ", "\ufeff"]
    rng = random.Random(33)
    path = tmp_path / "f.txt"
    for _ in range(400):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        data = (b"\xef\xbb\xbf" if rng.random() < 0.3 else b"") + text.encode()
        path.write_bytes(data)
        expected = data.decode("utf-8-sig").splitlines()
        assert list(text_lines(path, block_bytes)) == expected, data
