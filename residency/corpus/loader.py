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
scanned PDF, a .jsonl line with invalid JSON or missing / invalid fields, and a duplicate section
id (the later one; the message names the first) each become a `SkippedInput` with file, line and
reason, shown by `residency index` and kept in the manifest; `residency index --strict` turns any
of them into an error that writes nothing. A corpus with no section at all is a `CorpusError`.
Hidden files and directories (name starting with '.') are not part of the corpus.

Incremental loading: given the previous build (`PreviousCorpus`), a file whose sha256 and reader
version are unchanged is not parsed again: its sections (and their token counts, when counted the
same way) and its skipped inputs are taken from the previous build.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from residency.corpus.drafts import PREAMBLE_ANCHOR, Draft, slugify
from residency.corpus.formats import (
    BINARY_FORMATS,
    MISSING_LIBRARY,
    READER_VERSION,
    SUPPORTED_SUFFIXES,
    read_binary,
)
from residency.corpus.markdown import parse_markdown
from residency.corpus.model import MAX_SECTION_CHARS, Section, SkippedInput, SourceFile
from residency.errors import ConfigError, CorpusError
from residency.progress import BuildProgress
from residency.tokenizer import ModelTokenizer, TokenCountInfo

__all__ = ["PREAMBLE_ANCHOR", "SUPPORTED_SUFFIXES", "Corpus", "PreviousCorpus", "slugify"]

_BLANK = re.compile(r"^[ \t]*$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


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


@dataclass(frozen=True, slots=True)
class PreviousCorpus:
    """What the previous build read: enough to reuse its work on the files that did not change."""

    reader_version: str | None
    token_count: TokenCountInfo | None
    files: Mapping[str, str]  # relpath -> sha256
    sections: Mapping[str, Sequence[Section]] = field(default_factory=dict)  # by file
    skipped: Mapping[str, Sequence[SkippedInput]] = field(default_factory=dict)  # by file


class JsonlRecord(BaseModel):
    """One line of a .jsonl corpus file (other fields are ignored)."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    id: str = Field(min_length=1, max_length=1024, pattern=r"\S", description="Section id.")
    text: str = Field(min_length=1, max_length=10_000_000, pattern=r"\S", description="Body.")
    title: str | None = Field(default=None, max_length=1024, description="Title.")
    date: str | None = Field(default=None, pattern=_DATE.pattern, description="YYYY-MM-DD.")
    tags: tuple[str, ...] = Field(default=(), max_length=256, description="Tags.")
    source: str | None = Field(default=None, max_length=1024, description="Provenance.")


def parse_txt(stem: str, text: str) -> list[Draft]:
    """One section per blank-line separated paragraph."""
    drafts: list[Draft] = []
    para: list[str] = []
    start = 0
    for line_no, line in enumerate([*text.splitlines(), ""], start=1):
        if _BLANK.match(line):
            if para:
                n = len(drafts) + 1
                drafts.append(Draft(f"{stem}#p{n}", start, "", "\n".join(para).strip()))
            para = []
        else:
            if not para:
                start = line_no
            para.append(line)
    return drafts


def _validation_reason(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"]) or "record"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def parse_jsonl(rel: str, text: str) -> tuple[list[Draft], list[SkippedInput]]:
    """One section per JSON line; bad lines come back as skipped inputs with their line."""
    drafts: list[Draft] = []
    skipped: list[SkippedInput] = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            skipped.append(SkippedInput(file=rel, line=line_no, reason=f"invalid JSON: {exc}"))
            continue
        if not isinstance(raw, dict):
            reason = f"expected a JSON object, got {type(raw).__name__}"
            skipped.append(SkippedInput(file=rel, line=line_no, reason=reason))
            continue
        try:
            rec = JsonlRecord.model_validate(raw)
            day = dt.date.fromisoformat(rec.date) if rec.date else None
        except ValidationError as exc:
            skipped.append(SkippedInput(file=rel, line=line_no, reason=_validation_reason(exc)))
            continue
        except ValueError as exc:  # a well-formed but impossible date, e.g. 2025-02-30
            reason = f"date: {exc}"
            skipped.append(SkippedInput(file=rel, line=line_no, reason=reason))
            continue
        title = (rec.title or "").strip()
        text_ = rec.text.strip()
        drafts.append(Draft(rec.id, line_no, title, text_, day, rec.tags, rec.source))
    return drafts, skipped


def _decode(rel: str, data: bytes) -> str | SkippedInput:
    """The file's text, or why it cannot be read as UTF-8 text."""
    if b"\0" in data[:8192]:
        return SkippedInput(file=rel, line=0, reason="binary file (NUL bytes); not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        reason = f"not UTF-8 (byte {data[exc.start]:#04x} at offset {exc.start}); re-save as UTF-8"
        return SkippedInput(file=rel, line=line, reason=reason)
    if not text.strip():
        return SkippedInput(file=rel, line=0, reason="empty file")
    return text


def _corpus_files(root: Path) -> list[tuple[str, Path]]:
    """(relpath with '/', path) of every non-hidden file under root, sorted by relpath."""
    found = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or not path.is_file():
            continue
        found.append((rel.as_posix(), path))
    return sorted(found)


def _parse(rel: str, data: bytes) -> tuple[list[Draft], list[SkippedInput]]:
    """The sections and skipped inputs of one file's bytes, by its suffix."""
    suffix = Path(rel).suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        reason = f"unsupported file type '{suffix}' (indexed: {', '.join(SUPPORTED_SUFFIXES)})"
        return [], [SkippedInput(file=rel, line=0, reason=reason)]
    if suffix in BINARY_FORMATS:
        if not data.strip():
            return [], [SkippedInput(file=rel, line=0, reason="empty file")]
        drafts, skipped = read_binary(suffix, rel, data)
    else:
        text = _decode(rel, data)
        if isinstance(text, SkippedInput):
            return [], [text]
        stem = rel[: -len(suffix)]
        if suffix == ".jsonl":
            drafts, skipped = parse_jsonl(rel, text)
        elif suffix == ".md":
            drafts, skipped = parse_markdown(stem, text, rel)
        else:
            drafts, skipped = parse_txt(stem, text), []
    if not drafts and not skipped:
        skipped = [SkippedInput(file=rel, line=0, reason="no section text (only headings)")]
    return drafts, skipped


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


def _reusable(
    previous: PreviousCorpus | None, rel: str, digest: str
) -> tuple[list[Draft], list[SkippedInput]] | None:
    """The previous build's sections and skipped inputs of an unchanged file, or None.

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
    return [_draft_of(s) for s in previous.sections.get(rel, ())], skipped


def corpus_hash(files: list[SourceFile]) -> str:
    """sha256 over the sorted (relpath, content sha256) pairs of every file looked at."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.sha256}\n".encode())
    return h.hexdigest()


def _token_counts(
    drafts: list[tuple[str, Draft]],
    counter: ModelTokenizer,
    previous: PreviousCorpus | None,
    reused: set[str],
) -> list[int]:
    """Token counts of the drafts: a reused file's sections keep theirs when counted alike."""
    known: dict[str, int] = {}
    if previous is not None and previous.token_count == counter.info:
        known = {s.id: s.token_count for rel in reused for s in previous.sections.get(rel, ())}
    todo = [d.text for rel, d in drafts if not (rel in reused and d.id in known)]
    fresh = iter(counter.count_batch(todo) if todo else [])
    return [known[d.id] if rel in reused and d.id in known else next(fresh) for rel, d in drafts]


def load_corpus(
    root: Path,
    counter: ModelTokenizer,
    previous: PreviousCorpus | None = None,
    progress: BuildProgress | None = None,
) -> Corpus:
    """Read every file under `root` into sections (see the module docstring for the rules);
    files unchanged since `previous` are taken from it rather than parsed again. `progress`
    hears one step per file read."""
    if not root.is_dir():
        raise ConfigError(f"corpus directory {root} does not exist or is not a directory")
    seen: dict[str, str] = {}  # section id -> 'file:line' of its first occurrence
    drafts: list[tuple[str, Draft]] = []
    files: list[SourceFile] = []
    skipped: list[SkippedInput] = []
    parsed: list[str] = []
    reused: set[str] = set()
    listed = _corpus_files(root)
    if progress is not None:
        progress.start("reading corpus files", len(listed))
    for rel, path in listed:
        if progress is not None:
            progress.advance(1)
        try:
            data = path.read_bytes()
        except OSError as exc:
            skipped.append(SkippedInput(file=rel, line=0, reason=f"cannot read: {exc.strerror}"))
            continue
        digest = hashlib.sha256(data).hexdigest()
        again = _reusable(previous, rel, digest)
        if again is None:
            found, bad = _parse(rel, data)
            parsed.append(rel)
        else:
            found, bad = again
            reused.add(rel)
        skipped.extend(bad)
        kept = 0
        for d in found:
            if len(d.text) > MAX_SECTION_CHARS:
                reason = (
                    f"section {d.id!r} holds {len(d.text):,} characters ({len(data):,} bytes in "
                    f"the file), over the {MAX_SECTION_CHARS:,} one section may hold: give it "
                    "headings (Markdown) or blank lines (.txt) to split it"
                )
                skipped.append(SkippedInput(file=rel, line=d.line, reason=reason))
                continue
            if d.id in seen:
                reason = f"{_DUPLICATE}{d.id!r} (first at {seen[d.id]})"
                skipped.append(SkippedInput(file=rel, line=d.line, reason=reason))
                continue
            seen[d.id] = f"{rel}:{d.line}"
            drafts.append((rel, d))
            kept += 1
        files.append(SourceFile(path=rel, sha256=digest, size_bytes=len(data), sections=kept))
    if not drafts:
        detail = "; ".join(f"{s.location()}: {s.reason}" for s in skipped[:3])
        raise CorpusError(
            f"corpus {root} has no sections: {len(files)} file(s) looked at, "
            f"{len(skipped)} skipped"
            + (f" ({detail})" if detail else "")
            + f"; add {', '.join(SUPPORTED_SUFFIXES)} files with text"
        )
    counts = _token_counts(drafts, counter, previous, reused)
    sections = tuple(
        Section(
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
            order=i,
            token_count=n,
        )
        for i, ((rel, d), n) in enumerate(zip(drafts, counts, strict=True))
    )
    present = {f.path for f in files}
    removed = tuple(sorted(set(previous.files) - present)) if previous is not None else ()
    return Corpus(
        root,
        sections,
        tuple(files),
        tuple(skipped),
        corpus_hash(files),
        parsed_files=tuple(parsed),
        reused_files=tuple(sorted(reused)),
        removed_files=removed,
    )
