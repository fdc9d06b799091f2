"""Reading corpus files in bounded memory: one streamed scan (sha256, size, and for text files
UTF-8 validity and emptiness), then .txt paragraphs and .jsonl records parsed line by line.

A 200 MB .txt or .jsonl file is never held whole: the scan reads it in `BLOCK_BYTES` blocks, the
parse one line at a time, and a .txt paragraph longer than `MAX_SECTION_CHARS` stops being
stored (only its length is kept, for the skip message). Lines are cut exactly as
``str.splitlines`` cuts the whole text (``\\r\\n``, ``\\r``, ``\\u2028``... as well as ``\\n``), so
line numbers and paragraphs are the same as reading the file whole; a leading UTF-8 BOM is
dropped as ``utf-8-sig`` drops it.
"""

from __future__ import annotations

import codecs
import datetime as dt
import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from residency.corpus.drafts import Draft
from residency.corpus.model import MAX_SECTION_CHARS, SkippedInput

BLOCK_BYTES = 8 << 20  # read at a time by the scan
LINE_BLOCK_BYTES = 1 << 20  # read at a time by the line reader
NUL_WINDOW = 8192  # a NUL byte in the first 8 KiB: a binary file, not text
_BLANK = re.compile(r"^[ \t]*$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_BOM = "\ufeff"


@dataclass(frozen=True, slots=True)
class FileScan:
    """What one streamed read of a file found: its hash and size, and why it cannot be read
    (None: it can)."""

    sha256: str
    size_bytes: int
    problem: str | None
    line: int = 0  # where the problem is (0: the whole file)


@dataclass(frozen=True, slots=True)
class Oversized:
    """A section too long to index: its id, where it starts and its length in characters."""

    id: str
    line: int
    chars: int


def scan_file(path: Path, text: bool, block_bytes: int = BLOCK_BYTES) -> FileScan:
    """sha256 and size of `path` read block by block; a text file is also checked to be UTF-8
    (the first bad byte's offset and line), without NUL bytes, and not blank."""
    digest = hashlib.sha256()
    size = newlines = 0
    decoder = codecs.getincrementaldecoder("utf-8")()
    problem: tuple[str, int] | None = None
    blank, first = True, True  # first: no character decoded yet (a BOM there is dropped)
    with path.open("rb") as f:
        while block := f.read(block_bytes):
            digest.update(block)
            if text and problem is None:
                if size < NUL_WINDOW and b"\0" in block[: NUL_WINDOW - size]:
                    problem = ("binary file (NUL bytes); not text", 0)
                else:
                    try:
                        piece = decoder.decode(block)
                    except UnicodeDecodeError as exc:
                        problem = _not_utf8(exc, size, newlines, len(block))
                    else:
                        blank = blank and not _strip_bom(piece, first).strip()
                        first = first and not piece
            elif not text:
                blank = blank and not block.strip()
            size += len(block)
            newlines += block.count(b"\n")
    if text and problem is None:
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as exc:
            problem = _not_utf8(exc, size, newlines, 0)
    if problem is None and blank:
        problem = ("empty file", 0)
    reason, line = problem if problem is not None else (None, 0)
    return FileScan(digest.hexdigest(), size, reason, line)


def _strip_bom(piece: str, first: bool) -> str:
    return piece[1:] if first and piece.startswith(_BOM) else piece


def _not_utf8(exc: UnicodeDecodeError, size: int, newlines: int, block: int) -> tuple[str, int]:
    """The reason and line of a decoding error in the block read at file offset `size`."""
    data = exc.object  # the decoder's held-back bytes, then the block
    offset = size + block - len(data) + exc.start
    head = data[: exc.start]
    carried = len(data) - block  # bytes of the previous block held back by the decoder
    line = newlines - head[:carried].count(b"\n") + head.count(b"\n") + 1
    reason = f"not UTF-8 (byte {data[exc.start]:#04x} at offset {offset}); re-save as UTF-8"
    return reason, line


def text_lines(path: Path, block_bytes: int = LINE_BLOCK_BYTES) -> Iterator[str]:
    """The lines of a UTF-8 file (already scanned), as ``text.splitlines()`` gives them, read
    `block_bytes` at a time (a file that changed since its scan gets U+FFFD for bad bytes)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    carry, first = "", True
    with path.open("rb") as f:
        while True:
            block = f.read(block_bytes)
            text = carry + decoder.decode(block, final=not block)
            if first and text:
                text, first = _strip_bom(text, True), False
            pieces = text.splitlines(keepends=True)
            # The last piece may go on in the next block (no line end yet, or a "\r" that a
            # "\n" may follow: one line end, as splitlines reads "\r\n").
            carry = pieces.pop() if block and pieces and _open_ended(pieces[-1]) else ""
            for piece in pieces:
                yield piece.splitlines()[0]
            if not block:
                return


def _open_ended(piece: str) -> bool:
    """True when `piece` (one of ``splitlines(keepends=True)``) has no complete line end."""
    return piece.endswith("\r") or piece.splitlines()[0] == piece


@dataclass(slots=True)
class _Paragraph:
    """A .txt paragraph's lines, stored only while they could still make one section; its
    length and edge whitespace are kept either way (for the skip message)."""

    start: int
    lines: list[str] | None = field(default_factory=list)  # None: too long, dropped
    total: int = 0  # len("\n".join(lines))
    lead: int = 0  # its leading whitespace
    trail: int = 0  # its trailing whitespace

    def add(self, line: str) -> None:
        joiner = 1 if self.total else 0  # every line of a paragraph is non-empty
        if self.lead == self.total:  # all whitespace so far: the leading run goes on
            self.lead += joiner + len(line) - len(line.lstrip())
        core = line.rstrip()
        self.trail = len(line) - len(core) + (0 if core else self.trail + joiner)
        self.total += joiner + len(line)
        if self.lines is not None and self.total <= 2 * MAX_SECTION_CHARS:
            self.lines.append(line)
        else:
            self.lines = None

    def text_chars(self) -> int:
        """len("\n".join(lines).strip())."""
        return 0 if self.lead >= self.total else self.total - self.lead - self.trail


def txt_drafts(stem: str, lines: Iterable[str]) -> Iterator[Draft | Oversized]:
    """One section per blank-line separated paragraph, ``<stem>#p<N>``; a paragraph over the
    section limit comes back as `Oversized` (it is not held in memory)."""
    n = 0
    para: _Paragraph | None = None
    for line_no, line in enumerate(_ended(lines), start=1):
        if not _BLANK.match(line):
            if para is None:
                para = _Paragraph(line_no)
            para.add(line)
            continue
        if para is not None and (chars := para.text_chars()):
            # (a paragraph of only other whitespace, e.g. "\u3000", is no section)
            n += 1
            if chars > MAX_SECTION_CHARS or para.lines is None:
                yield Oversized(f"{stem}#p{n}", para.start, chars)
            else:
                yield Draft(f"{stem}#p{n}", para.start, "", "\n".join(para.lines).strip())
        para = None


def _ended(lines: Iterable[str]) -> Iterator[str]:
    yield from lines
    yield ""


class JsonlRecord(BaseModel):
    """One line of a .jsonl corpus file (other fields are ignored)."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    id: str = Field(min_length=1, max_length=1024, pattern=r"\S", description="Section id.")
    text: str = Field(min_length=1, max_length=10_000_000, pattern=r"\S", description="Body.")
    title: str | None = Field(default=None, max_length=1024, description="Title.")
    date: str | None = Field(default=None, pattern=_DATE.pattern, description="YYYY-MM-DD.")
    tags: tuple[str, ...] = Field(default=(), max_length=256, description="Tags.")
    source: str | None = Field(default=None, max_length=1024, description="Provenance.")


def _validation_reason(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"]) or "record"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def jsonl_drafts(rel: str, lines: Iterable[str]) -> Iterator[Draft | SkippedInput]:
    """One section per JSON line; a bad line comes back as a skipped input with its line."""
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            yield SkippedInput(file=rel, line=line_no, reason=f"invalid JSON: {exc}")
            continue
        if not isinstance(raw, dict):
            reason = f"expected a JSON object, got {type(raw).__name__}"
            yield SkippedInput(file=rel, line=line_no, reason=reason)
            continue
        try:
            rec = JsonlRecord.model_validate(raw)
            day = dt.date.fromisoformat(rec.date) if rec.date else None
        except ValidationError as exc:
            yield SkippedInput(file=rel, line=line_no, reason=_validation_reason(exc))
            continue
        except ValueError as exc:  # a well-formed but impossible date, e.g. 2025-02-30
            yield SkippedInput(file=rel, line=line_no, reason=f"date: {exc}")
            continue
        title = (rec.title or "").strip()
        yield Draft(rec.id, line_no, title, rec.text.strip(), day, rec.tags, rec.source)
