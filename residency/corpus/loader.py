"""Corpus loading: a directory of .md, .txt and .jsonl files into sections with stable ids.

Section ids (stable while a file's path and headings are unchanged, so re-indexing an unchanged
file gives the same ids):

- ``.md``: ``<relpath without .md>#<anchor>``; the anchor is the heading's explicit pandoc
  ``{#anchor}``, else `slugify` of the heading (duplicates in one file get -2, -3, ...). Text
  before the first heading is ``#_preamble``. Headings inside fenced code blocks are text.
  A heading with an empty body (e.g. a title directly followed by a subheading) yields no section.
- ``.txt``: one section per blank-line separated paragraph, ``<relpath without .txt>#p<N>``.
- ``.jsonl``: one section per line, id = the record's ``id`` verbatim; ``text`` required,
  ``title``, ``date`` (YYYY-MM-DD), ``tags`` and ``source`` optional, other fields ignored.

Bad input policy: **index the rest and list what was skipped.** An empty, binary or non-UTF-8
file, a file of an unsupported type, a .jsonl line with invalid JSON or missing / invalid fields,
and a duplicate section id (the later one; the message names the first) each become a
`SkippedInput` with file, line and reason, shown by `residency index` and kept in the manifest;
`residency index --strict` turns any of them into an error that writes nothing. A corpus with no
section at all is a `CorpusError`. Hidden files and directories (name starting with '.') are not
part of the corpus.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from residency.corpus.model import Section, SkippedInput, SourceFile
from residency.errors import ConfigError, CorpusError
from residency.tokenizer import ModelTokenizer

SUPPORTED_SUFFIXES = (".md", ".txt", ".jsonl")
PREAMBLE_ANCHOR = "_preamble"

_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
_CLOSING_HASHES = re.compile(r"(?:^|[ \t]+)#+$")
_ATTRS = re.compile(r"[ \t]*\{([^{}]*)\}$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_BLANK = re.compile(r"^[ \t]*$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True, slots=True)
class _Draft:
    id: str
    line: int
    title: str
    text: str
    date: dt.date | None = None
    tags: tuple[str, ...] = ()
    source: str | None = None


@dataclass(frozen=True, slots=True)
class Corpus:
    """What the loader found: sections in corpus order, every file looked at, what was skipped."""

    root: Path
    sections: tuple[Section, ...]
    files: tuple[SourceFile, ...]
    skipped: tuple[SkippedInput, ...]
    corpus_hash: str


class JsonlRecord(BaseModel):
    """One line of a .jsonl corpus file (other fields are ignored)."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    id: str = Field(min_length=1, max_length=1024, pattern=r"\S", description="Section id.")
    text: str = Field(min_length=1, max_length=10_000_000, pattern=r"\S", description="Body.")
    title: str | None = Field(default=None, max_length=1024, description="Title.")
    date: str | None = Field(default=None, pattern=_DATE.pattern, description="YYYY-MM-DD.")
    tags: tuple[str, ...] = Field(default=(), max_length=256, description="Tags.")
    source: str | None = Field(default=None, max_length=1024, description="Provenance.")


def slugify(text: str) -> str:
    """NFKC, lowercase, whitespace runs to '-', punctuation dropped, CJK kept; '' -> 'section'.

    >>> slugify("灯器の日常点検（月例）")
    '灯器の日常点検月例'
    >>> slugify("Step 2: Replace the LAMP!")
    'step-2-replace-the-lamp'
    """
    out: list[str] = []
    for ch in unicodedata.normalize("NFKC", text).lower().strip():
        if ch.isspace() or ch == "-":
            out.append("-")
        elif ch == "_" or unicodedata.category(ch)[0] in "LNM":
            out.append(ch)
    return re.sub(r"-{2,}", "-", "".join(out)).strip("-") or "section"


def _split_heading(raw: str) -> tuple[str, str | None]:
    """('Heading text', explicit anchor or None) from the text after the #'s."""
    text = _CLOSING_HASHES.sub("", raw.strip())
    anchor = None
    attrs = _ATTRS.search(text)
    if attrs:
        ids = [a[1:] for a in attrs.group(1).split() if a.startswith("#") and len(a) > 1]
        if ids:
            anchor = ids[0]
            text = text[: attrs.start()]
    return text.strip(), anchor


def parse_markdown(stem: str, text: str) -> list[_Draft]:
    """Sections of one markdown file (`stem` = relpath without .md)."""
    drafts: list[_Draft] = []
    used: set[str] = set()
    path: list[tuple[int, str]] = []  # (level, heading) of the enclosing headings
    anchor, title, start_line = PREAMBLE_ANCHOR, "", 1
    body: list[str] = []
    fence: str | None = None

    def flush() -> None:
        content = "\n".join(body).strip()
        if content:
            drafts.append(_Draft(f"{stem}#{anchor}", start_line, title, content))

    for line_no, line in enumerate(text.splitlines(), start=1):
        fence_match = _FENCE.match(line)
        if fence_match:
            mark = fence_match.group(1)
            if fence is None:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence):
                fence = None
        heading = _HEADING.match(line) if fence is None and not fence_match else None
        if heading is None:
            body.append(line)
            continue
        flush()
        level = len(heading.group(1))
        heading_text, explicit = _split_heading(heading.group(2) or "")
        anchor = explicit or slugify(heading_text)
        if explicit is None and anchor in used:
            n = 2
            while f"{anchor}-{n}" in used:
                n += 1
            anchor = f"{anchor}-{n}"
        used.add(anchor)
        while path and path[-1][0] >= level:
            path.pop()
        path.append((level, heading_text))
        title = " > ".join(h for _, h in path if h)
        start_line, body = line_no, list[str]()
    flush()
    return drafts


def parse_txt(stem: str, text: str) -> list[_Draft]:
    """One section per blank-line separated paragraph."""
    drafts: list[_Draft] = []
    para: list[str] = []
    start = 0
    for line_no, line in enumerate([*text.splitlines(), ""], start=1):
        if _BLANK.match(line):
            if para:
                n = len(drafts) + 1
                drafts.append(_Draft(f"{stem}#p{n}", start, "", "\n".join(para).strip()))
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


def parse_jsonl(rel: str, text: str) -> tuple[list[_Draft], list[SkippedInput]]:
    """One section per JSON line; bad lines come back as skipped inputs with their line."""
    drafts: list[_Draft] = []
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
        drafts.append(_Draft(rec.id, line_no, title, text_, day, rec.tags, rec.source))
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


def _parse_file(rel: str, path: Path) -> tuple[bytes, list[_Draft], list[SkippedInput]]:
    data = path.read_bytes()
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        reason = f"unsupported file type '{suffix}' (indexed: {', '.join(SUPPORTED_SUFFIXES)})"
        return data, [], [SkippedInput(file=rel, line=0, reason=reason)]
    text = _decode(rel, data)
    if isinstance(text, SkippedInput):
        return data, [], [text]
    stem = rel[: -len(suffix)]
    if suffix == ".jsonl":
        drafts, skipped = parse_jsonl(rel, text)
    else:
        drafts, skipped = (parse_markdown if suffix == ".md" else parse_txt)(stem, text), []
    if not drafts and not skipped:
        skipped = [SkippedInput(file=rel, line=0, reason="no section text (only headings)")]
    return data, drafts, skipped


def corpus_hash(files: list[SourceFile]) -> str:
    """sha256 over the sorted (relpath, content sha256) pairs of every file looked at."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.sha256}\n".encode())
    return h.hexdigest()


def load_corpus(root: Path, counter: ModelTokenizer) -> Corpus:
    """Read every file under `root` into sections (see the module docstring for the rules)."""
    if not root.is_dir():
        raise ConfigError(f"corpus directory {root} does not exist or is not a directory")
    seen: dict[str, str] = {}  # section id -> 'file:line' of its first occurrence
    drafts: list[tuple[str, _Draft]] = []
    files: list[SourceFile] = []
    skipped: list[SkippedInput] = []
    for rel, path in _corpus_files(root):
        try:
            data, found, bad = _parse_file(rel, path)
        except OSError as exc:
            skipped.append(SkippedInput(file=rel, line=0, reason=f"cannot read: {exc.strerror}"))
            continue
        skipped.extend(bad)
        kept = 0
        for d in found:
            if d.id in seen:
                reason = f"duplicate section id {d.id!r} (first at {seen[d.id]})"
                skipped.append(SkippedInput(file=rel, line=d.line, reason=reason))
                continue
            seen[d.id] = f"{rel}:{d.line}"
            drafts.append((rel, d))
            kept += 1
        digest = hashlib.sha256(data).hexdigest()
        files.append(SourceFile(path=rel, sha256=digest, size_bytes=len(data), sections=kept))
    if not drafts:
        detail = "; ".join(f"{s.location()}: {s.reason}" for s in skipped[:3])
        raise CorpusError(
            f"corpus {root} has no sections: {len(files)} file(s) looked at, "
            f"{len(skipped)} skipped"
            + (f" ({detail})" if detail else "")
            + f"; add {', '.join(SUPPORTED_SUFFIXES)} files with text"
        )
    counts = counter.count_batch([d.text for _, d in drafts])
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
            order=i,
            token_count=n,
        )
        for i, ((rel, d), n) in enumerate(zip(drafts, counts, strict=True))
    )
    return Corpus(root, sections, tuple(files), tuple(skipped), corpus_hash(files))
