"""Run the real-document benchmark: index its files with the corpus loader, compare each with
its reference, and print the per-file and per-format tables with the worst files named.

``python -m residency.eval.extraction_report [FOLDER]`` (default tests/real_documents).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from residency.corpus.loader import load_corpus
from residency.corpus.model import Section, SkippedInput
from residency.eval.extraction import (
    FileFigures,
    Totals,
    file_figures,
    file_score,
    totals,
    worst_files,
)
from residency.eval.real_documents import FORMATS, load_manifest
from residency.tokenizer import ApproxTokenizer

FILES_DIR = "files"  # the documents, under the benchmark folder (references sit beside it)


def measure_documents(folder: Path) -> list[FileFigures]:
    """Index `folder`/files in one pass and compare every file with its reference."""
    manifest = load_manifest(folder)
    corpus = load_corpus(folder / FILES_DIR, ApproxTokenizer())
    sections: dict[str, list[Section]] = defaultdict(list)
    for section in corpus.sections:
        sections[section.file].append(section)
    skipped: dict[str, list[SkippedInput]] = defaultdict(list)
    for skip in corpus.skipped:
        skipped[skip.file].append(skip)
    out = []
    for doc in manifest.files:
        rel = doc.path.removeprefix(FILES_DIR + "/")
        reference = (folder / doc.reference).read_text(encoding="utf-8")
        out.append(file_figures(doc, reference, sections[rel], skipped[rel]))
    return out


def by_format(figures: list[FileFigures]) -> dict[str, Totals]:
    """Totals per format, then 'all'."""
    out: dict[str, Totals] = {fmt: totals(f for f in figures if f.format == fmt) for fmt in FORMATS}
    out["all"] = totals(figures)
    return out


def _ratio(x: float) -> str:
    return f"{x:.3f}"


def _row(name: str, t: Totals) -> list[str]:
    return [
        name,
        str(t.files),
        _ratio(t.words_kept),
        _ratio(t.words_kept_raw),
        _ratio(t.words_added),
        f"{t.headings_matched}/{t.headings_expected}",
        _ratio(t.heading_recall),
        f"{t.headings_matched}/{t.headings_found}",
        _ratio(t.heading_precision),
        str(t.bad_chars),
        str(t.unexpected),
    ]


_COLUMNS = (
    "file / format",
    "files",
    "words kept",
    "kept (raw)",
    "words added",
    "headings found",
    "recall",
    "sections true",
    "precision",
    "bad chars",
    "not as expected",
)


def table(rows: list[tuple[str, Totals]], title: str) -> Table:
    """A rich table of totals, one row each."""
    out = Table(title=title)
    for col in _COLUMNS:
        out.add_column(col, justify="left" if col == "file / format" else "right")
    for name, t in rows:
        out.add_row(*_row(name, t))
    return out


def render(figures: list[FileFigures], console: Console) -> None:
    """Per-file table, per-format table, then the three worst files with their figures."""
    per_file = [(f.path.removeprefix(FILES_DIR + "/"), totals([f])) for f in figures]
    console.print(table(per_file, "Real documents, per file"))
    console.print(table(list(by_format(figures).items()), "Real documents, per format"))
    for f in worst_files(figures):
        t = totals([f])
        reason = f" skipped: {'; '.join(f.skipped)}" if f.skipped else ""
        console.print(
            f"worst: {f.path} score {file_score(f):.3f}: kept {t.words_kept:.3f}, recall "
            f"{t.heading_recall:.3f}, precision {t.heading_precision:.3f}, bad chars "
            f"{f.bad_chars}, {f.sections} sections{reason}",
            soft_wrap=True,
        )


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/real_documents")
    render(measure_documents(folder), Console(width=200))


if __name__ == "__main__":
    main()
