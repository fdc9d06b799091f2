"""Which reader reads which file: text formats in the core install, binary formats behind extras.

A reader takes the file's path relative to the corpus root and its bytes, and returns the
sections it found and the inputs it skipped. A format whose library is not installed is a skipped
input naming the install command, so a corpus with a few PDFs still indexes its Markdown.
`READER_VERSION` names the readers' behaviour: an index built by other readers is re-read whole
on the next build (its vectors are still reused by content hash).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from residency.corpus.drafts import Draft
from residency.corpus.model import SkippedInput

# 1: regex Markdown splitter, .md/.txt/.jsonl; 2: CommonMark, PDF, HTML, DOCX; 3: HTML main
# element, colliding ids suffixed, front matter titles, control characters removed; 4: PDF
# outline entries over drawings kept, outline titles found at a line's start
READER_VERSION = "4"

BinaryReader = Callable[[str, bytes], tuple[list[Draft], list[SkippedInput]]]


@dataclass(frozen=True, slots=True)
class BinaryFormat:
    """A format read from bytes by an optional library."""

    name: str
    module: str  # the import that must succeed
    extra: str  # residency[<extra>] installs it
    reader: Callable[[], BinaryReader]


def _pdf() -> BinaryReader:
    from residency.corpus.pdf import read_pdf

    return read_pdf


def _html() -> BinaryReader:
    from residency.corpus.html import read_html

    return read_html


def _docx() -> BinaryReader:
    from residency.corpus.word import read_docx

    return read_docx


TEXT_SUFFIXES = (".md", ".txt", ".jsonl")
BINARY_FORMATS: dict[str, BinaryFormat] = {
    ".pdf": BinaryFormat("PDF", "pypdfium2", "pdf", _pdf),
    ".html": BinaryFormat("HTML", "trafilatura", "html", _html),
    ".htm": BinaryFormat("HTML", "trafilatura", "html", _html),
    ".docx": BinaryFormat("DOCX", "docx", "docx", _docx),
}
SUPPORTED_SUFFIXES = (*TEXT_SUFFIXES, *BINARY_FORMATS)


MISSING_LIBRARY = "needs the optional dependency"  # in the reason of such a skipped input


def missing_library(fmt: BinaryFormat) -> str | None:
    """Why `fmt` cannot be read here (its library is not installed), or None."""
    if importlib.util.find_spec(fmt.module) is not None:
        return None
    return f"{fmt.name} {MISSING_LIBRARY} {fmt.module!r}: pip install 'residency[{fmt.extra}]'"


def read_binary(suffix: str, rel: str, data: bytes) -> tuple[list[Draft], list[SkippedInput]]:
    """Sections of a PDF / HTML / DOCX file, or why it was skipped."""
    fmt = BINARY_FORMATS[suffix]
    problem = missing_library(fmt)
    if problem is not None:
        return [], [SkippedInput(file=rel, line=0, reason=problem)]
    return fmt.reader()(rel, data)
