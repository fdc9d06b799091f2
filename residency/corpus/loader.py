"""Corpus loading: a directory of files into sections with stable ids, re-reading only the files
whose content changed since the previous build.

Section ids (stable while a file's path and headings are unchanged, so re-indexing an unchanged
file gives the same ids):

- ``.md``: ``<relpath without .md>#<anchor>``, CommonMark headings (`residency.corpus.markdown`);
  the anchor is the heading's explicit pandoc ``{#anchor}``, else `slugify` of the heading
  (duplicates in one file get -2, -3, ...). Text before the first heading is ``#_preamble``.
  A heading with an empty body (e.g. a title directly followed by a subheading) yields no section.
- ``.pdf``, ``.html``/``.htm``, ``.docx``: ``<relpath>#<anchor>`` by the same rules, headings from
  the PDF outline or font sizes, the page's ``h1``-``h6``, Word heading styles (`formats`).
- ``.txt``: one section per blank-line separated paragraph, ``<relpath without .txt>#p<N>``.
- ``.jsonl``: one section per line, id = the record's ``id`` verbatim; ``text`` required,
  ``title``, ``date`` (YYYY-MM-DD), ``tags`` and ``source`` optional, other fields ignored.

Bad input policy: **index the rest and list what was skipped.** An empty, binary or non-UTF-8
text file, a file of an unsupported type or whose reader is not installed, an encrypted or
scanned PDF, a .jsonl line with invalid JSON or missing / invalid fields, and any exception inside
one file's reader each become a `SkippedInput` with file, line and reason (the exception's class
and message), shown by `residency index` and kept in the manifest; `residency index --strict`
turns any of them into an error that writes nothing. No content is dropped for an id: a section
whose id another file already gave (``notes.md`` and ``notes.txt``, two .jsonl records) is kept
as ``<id>-2``, ``-3``, ..., with a note naming the first (a `SkippedInput` too, so `--strict`
still refuses it and the next build re-reads the file). A corpus with no section at all is a
`CorpusError`. Hidden files and directories (name starting with '.') are not part of the corpus.

Incremental loading: given the previous build (`PreviousCorpus`), a file whose sha256 and reader
version are unchanged is not parsed again: its sections (and their token counts, when counted the
same way) and its skipped inputs are taken from the previous build.

Bounded memory: `CorpusStream` yields sections as it reads them (token counts in batches of
`SECTION_BATCH`), keeping only section ids and per-file summaries; .txt and .jsonl files are
streamed line by line (`residency.corpus.text_files`), other formats are read one file at a time.
`load_corpus` collects the stream for callers that want every section at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from residency.corpus.clean_text import clean_draft
from residency.corpus.drafts import PREAMBLE_ANCHOR, Draft, slugify
from residency.corpus.formats import (
    MISSING_LIBRARY,
    READER_VERSION,
    SUPPORTED_SUFFIXES,
    TEXT_SUFFIXES,
    read_binary,
)
from residency.corpus.listing import corpus_files, reason_text
from residency.corpus.markdown import parse_markdown
from residency.corpus.model import MAX_SECTION_CHARS, Section, SkippedInput, SourceFile
from residency.corpus.text_files import (
    FileScan,
    Oversized,
    jsonl_drafts,
    scan_file,
    text_lines,
    txt_drafts,
)
from residency.errors import ConfigError, CorpusError
from residency.progress import BuildProgress
from residency.tokenizer import ModelTokenizer, TokenCountInfo

__all__ = [
    "PREAMBLE_ANCHOR",
    "SUPPORTED_SUFFIXES",
    "Corpus",
    "CorpusStream",
    "PreviousCorpus",
    "slugify",
]

SECTION_BATCH = 512  # sections counted (one count_batch call) and handed on together


@dataclass(frozen=True, slots=True)
class Corpus:
    """What the loader found: sections in corpus order, every file looked at, what was skipped."""

    root: Path
    sections: tuple[Section, ...]
    files: tuple[SourceFile, ...]
    skipped: tuple[SkippedInput, ...]
    corpus_hash: str
    parsed_files: tuple[str, ...] = ()  # read and parsed this time (new or changed)
    reused_files: tuple[str, ...] = ()  # unchanged since the previous build: taken from it
    removed_files: tuple[str, ...] = ()  # in the previous build, gone now


def _no_sections(rel: str) -> Iterable[Section]:
    return ()


@dataclass(frozen=True, slots=True)
class PreviousCorpus:
    """What the previous build read: enough to reuse its work on the files that did not change."""

    reader_version: str | None
    token_count: TokenCountInfo | None
    files: Mapping[str, str]  # relpath -> sha256
    # The previous build's sections of one file, in order (read when needed, not held).
    sections_of: Callable[[str], Iterable[Section]] = _no_sections
    skipped: Mapping[str, Sequence[SkippedInput]] = field(default_factory=dict)  # by file


def _parse(
    rel: str, path: Path, scan: FileScan, skips: list[SkippedInput]
) -> Iterator[Draft | Oversized]:
    """The sections of one file, by its suffix; what cannot be read goes to `skips`."""
    suffix = Path(rel).suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        reason = f"unsupported file type '{suffix}' (indexed: {', '.join(SUPPORTED_SUFFIXES)})"
        skips.append(SkippedInput(file=rel, line=0, reason=reason))
        return
    if scan.problem is not None:
        skips.append(SkippedInput(file=rel, line=scan.line, reason=scan.problem))
        return
    stem = rel[: -len(suffix)]
    if suffix == ".txt":
        yield from txt_drafts(stem, text_lines(path))
    elif suffix == ".jsonl":
        for item in jsonl_drafts(rel, text_lines(path)):
            if isinstance(item, SkippedInput):
                skips.append(item)
            else:
                yield item
    else:
        data = path.read_bytes()
        try:
            if suffix == ".md":
                drafts, bad = parse_markdown(stem, data.decode("utf-8-sig"), rel)
            else:
                drafts, bad = read_binary(suffix, rel, data)
        except Exception as exc:  # one file's reader failing never aborts the run
            failed = f"reader failed: {type(exc).__name__}: {exc}"
            skips.append(SkippedInput(file=rel, line=0, reason=reason_text(failed)))
            return
        del data
        skips.extend(bad)
        yield from drafts


def _draft_of(section: Section) -> Draft:
    return Draft(
        section.id,
        section.line,
        section.title,
        section.text,
        section.date,
        section.tags,
        section.source,
        section.page,
        section.page_breaks,
    )


_DUPLICATE = "duplicate section id "


def _reusable(previous: PreviousCorpus | None, rel: str, digest: str) -> list[SkippedInput] | None:
    """The previous build's skipped inputs of an unchanged file (its sections are taken from
    that build too), or None: parse it.

    A file one of whose sections was skipped as a duplicate is read again (the section it
    collided with may be gone now), and so is one skipped for want of its reader's library
    (it may be installed now)."""
    if previous is None or previous.reader_version != READER_VERSION:
        return None
    if previous.files.get(rel) != digest:
        return None
    skipped = list(previous.skipped.get(rel, ()))
    if any(s.reason.startswith(_DUPLICATE) or MISSING_LIBRARY in s.reason for s in skipped):
        return None
    return skipped


def corpus_hash(files: list[SourceFile]) -> str:
    """sha256 over the sorted (relpath, content sha256) pairs of every file looked at."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.sha256}\n".encode())
    return h.hexdigest()


_Pending = tuple[str, Draft, int | None]  # (file, draft, token count when known)


class CorpusStream:
    """One pass over a corpus directory: iterating yields its sections in corpus order (see the
    module docstring for the rules); afterwards `files`, `skipped` and the rest say what was
    read. Iterating raises CorpusError at the end when no file gave a section."""

    def __init__(
        self,
        root: Path,
        counter: ModelTokenizer,
        previous: PreviousCorpus | None = None,
        progress: BuildProgress | None = None,
        batch: int = SECTION_BATCH,
    ) -> None:
        if not root.is_dir():
            raise ConfigError(f"corpus directory {root} does not exist or is not a directory")
        self.root, self._counter, self._previous = root, counter, previous
        self._progress, self._batch = progress, batch
        self.files: list[SourceFile] = []
        self.skipped: list[SkippedInput] = []
        self.parsed_files: list[str] = []
        self.reused_files: list[str] = []
        self.section_count = 0
        self._seen: dict[str, str] = {}  # section id -> 'file:line' of its first occurrence
        self._pending: list[_Pending] = []
        self._same_counting = previous is not None and previous.token_count == counter.info

    def __iter__(self) -> Iterator[Section]:
        listed, links = corpus_files(self.root)
        self.skipped += links
        if self._progress is not None:
            self._progress.start("reading corpus files", len(listed))
        for rel, path in listed:
            if self._progress is not None:
                self._progress.advance(1)
            yield from self._file(rel, path)
        yield from self._flush()
        if not self.section_count:
            detail = "; ".join(f"{s.location()}: {s.reason}" for s in self.skipped[:3])
            raise CorpusError(
                f"corpus {self.root} has no sections: {len(self.files)} file(s) looked at, "
                f"{len(self.skipped)} skipped"
                + (f" ({detail})" if detail else "")
                + f"; add {', '.join(SUPPORTED_SUFFIXES)} files with text"
            )

    def _file(self, rel: str, path: Path) -> Iterator[Section]:
        text = Path(rel).suffix.lower() in TEXT_SUFFIXES
        try:
            scan = scan_file(path, text)
        except OSError as exc:
            unread = SkippedInput(file=rel, line=0, reason=reason_text(f"cannot read: {exc}"))
            self.skipped.append(unread)
            return
        reused = _reusable(self._previous, rel, scan.sha256)
        items, file_skips = self._drafts_of(rel, path, scan, reused)
        draft_skips: list[SkippedInput] = []
        kept = found = 0
        try:
            for draft, count in items:
                found += 1
                if isinstance(draft, Draft):
                    draft = clean_draft(draft)
                    if not draft.text.strip():
                        why = f"section {draft.id!r} holds only control characters"
                        draft_skips.append(SkippedInput(file=rel, line=draft.line, reason=why))
                        continue
                refused = self._refusal(draft, scan.size_bytes)
                if refused is not None or isinstance(draft, Oversized):
                    refused = refused or f"section {draft.id!r} is too long to index"
                    draft_skips.append(SkippedInput(file=rel, line=draft.line, reason=refused))
                    continue
                if draft.id in self._seen:
                    kept_as = self._free_id(draft.id)
                    note = f"{_DUPLICATE}{draft.id!r} (first at {self._seen[draft.id]}): "
                    note += f"kept as {kept_as!r}"
                    draft_skips.append(SkippedInput(file=rel, line=draft.line, reason=note))
                    draft = dataclasses.replace(draft, id=kept_as)
                self._seen[draft.id] = f"{rel}:{draft.line}"
                self._pending.append((rel, draft, count))
                kept += 1
                if len(self._pending) >= self._batch:
                    yield from self._flush()
        except OSError as exc:  # gone or unreadable since it was scanned
            gone = reason_text(f"cannot read: {exc}")
            draft_skips.append(SkippedInput(file=rel, line=0, reason=gone))
        except Exception as exc:  # a streaming reader failing part-way: the rest is kept
            failed = reason_text(f"reader failed: {type(exc).__name__}: {exc}")
            draft_skips.append(SkippedInput(file=rel, line=0, reason=failed))
        if reused is None and not found and not file_skips:
            file_skips = [SkippedInput(file=rel, line=0, reason="no section text (only headings)")]
        self.skipped += file_skips + draft_skips
        self.files.append(
            SourceFile(path=rel, sha256=scan.sha256, size_bytes=scan.size_bytes, sections=kept)
        )

    def _drafts_of(
        self, rel: str, path: Path, scan: FileScan, reused: list[SkippedInput] | None
    ) -> tuple[Iterable[tuple[Draft | Oversized, int | None]], list[SkippedInput]]:
        """The file's drafts with their token counts where known, and its skips: the previous
        build's sections when the file is unchanged (counts kept if counted the same way), else
        parsed now (the skips list fills as the drafts are read)."""
        if reused is not None and self._previous is not None:
            self.reused_files.append(rel)
            same = self._same_counting
            return (
                (_draft_of(s), s.token_count if same else None)
                for s in self._previous.sections_of(rel)
            ), reused
        self.parsed_files.append(rel)
        file_skips: list[SkippedInput] = []
        return ((d, None) for d in _parse(rel, path, scan, file_skips)), file_skips

    def _refusal(self, draft: Draft | Oversized, size_bytes: int) -> str | None:
        """Why a section is not indexed (too long, a duplicate id), or None."""
        chars = draft.chars if isinstance(draft, Oversized) else len(draft.text)
        if chars > MAX_SECTION_CHARS:
            return (
                f"section {draft.id!r} holds {chars:,} characters ({size_bytes:,} bytes in "
                f"the file), over the {MAX_SECTION_CHARS:,} one section may hold: give it "
                "headings (Markdown) or blank lines (.txt) to split it"
            )
        return None

    def _free_id(self, taken: str) -> str:
        """`taken` with the smallest -N suffix no section has yet."""
        n = 2
        while f"{taken}-{n}" in self._seen:
            n += 1
        return f"{taken}-{n}"

    def _flush(self) -> Iterator[Section]:
        """The pending drafts as sections: token counts for those without one, in one batch."""
        pending, self._pending = self._pending, []
        todo = [d.text for _, d, n in pending if n is None]
        fresh = iter(self._counter.count_batch(todo) if todo else [])
        for rel, d, n in pending:
            yield Section(
                id=d.id,
                file=rel,
                line=d.line,
                title=d.title,
                text=d.text,
                date=d.date,
                tags=d.tags,
                source=d.source,
                page=d.page,
                page_breaks=d.page_breaks,
                order=self.section_count,
                token_count=next(fresh) if n is None else n,
            )
            self.section_count += 1

    def corpus_hash(self) -> str:
        """sha256 over every file looked at (after the pass)."""
        return corpus_hash(self.files)

    def removed_files(self) -> tuple[str, ...]:
        """Files of the previous build that are gone now (after the pass)."""
        if self._previous is None:
            return ()
        present = {f.path for f in self.files}
        return tuple(sorted(set(self._previous.files) - present))

    def corpus(self, sections: Sequence[Section]) -> Corpus:
        """The pass's result with its sections, as `load_corpus` returns it."""
        return Corpus(
            self.root,
            tuple(sections),
            tuple(self.files),
            tuple(self.skipped),
            self.corpus_hash(),
            parsed_files=tuple(self.parsed_files),
            reused_files=tuple(sorted(self.reused_files)),
            removed_files=self.removed_files(),
        )


def load_corpus(
    root: Path,
    counter: ModelTokenizer,
    previous: PreviousCorpus | None = None,
    progress: BuildProgress | None = None,
) -> Corpus:
    """Read every file under `root` into sections (see the module docstring for the rules);
    files unchanged since `previous` are taken from it rather than parsed again. `progress`
    hears one step per file read. Holds every section: `CorpusStream` streams them."""
    stream = CorpusStream(root, counter, previous, progress)
    sections = list(stream)
    return stream.corpus(sections)
