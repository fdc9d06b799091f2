"""The real-document benchmark's manifest: public files the readers were not written against, each
with its source, licence, reference text and the headings a person sees (tests/real_documents/).

The reference text comes from an extractor independent of the readers (poppler's pdftotext, lxml
on the page's main element, the DOCX's own XML, the raw Markdown / text file); the headings were
counted by hand from each file. `scripts/real_document_references.py` regenerates the references.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

DocumentFormat = Literal["pdf", "html", "docx", "markdown", "text"]
FORMATS: tuple[DocumentFormat, ...] = ("pdf", "html", "docx", "markdown", "text")
MANIFEST_NAME = "manifest.json"


class RealDocument(BaseModel):
    """One benchmark file: where it came from and what reading it should give."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(
        min_length=1, max_length=300, description="The file, relative to the benchmark folder."
    )
    format: DocumentFormat = Field(description="Which reader reads it.")
    language: Literal["en", "ja", "de"] = Field(description="The main language of its text.")
    description: str = Field(
        min_length=1, max_length=300, description="What it is (producer, layout, difficulty)."
    )
    source_repo: str = Field(
        min_length=3, max_length=140, description="Public GitHub repository, 'owner/name'."
    )
    source_path: str = Field(min_length=1, max_length=300, description="Path in that repository.")
    source_commit: str = Field(
        min_length=40, max_length=40, description="The commit the file was taken from."
    )
    licence: str = Field(
        min_length=2, max_length=200, description="SPDX id of the repository's or file's licence."
    )
    reference: str = Field(
        min_length=1,
        max_length=300,
        description="The reference text file, relative to the benchmark folder.",
    )
    main_xpath: str | None = Field(
        default=None,
        max_length=300,
        description="HTML: the XPath of the page's main element the reference is taken from.",
    )
    expect: Literal["indexed", "skipped"] = Field(
        default="indexed",
        description="'skipped': the file cannot be read (encrypted, scanned, no main text) and "
        "must be skipped by name with a reason, never abort the run.",
    )
    headings: tuple[str, ...] = Field(
        default=(),
        max_length=500,
        description="The headings a person sees, in order, counted by hand ('' for none).",
    )
    note: str = Field(
        default="", max_length=500, description="How the headings were counted where unclear."
    )


class RealDocumentManifest(BaseModel):
    """Every benchmark file (tests/real_documents/manifest.json)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    files: tuple[RealDocument, ...] = Field(min_length=1, max_length=10_000)


def load_manifest(folder: Path) -> RealDocumentManifest:
    """The benchmark manifest in `folder`."""
    data = orjson.loads((folder / MANIFEST_NAME).read_bytes())
    return RealDocumentManifest.model_validate(data)
