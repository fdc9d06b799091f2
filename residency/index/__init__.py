"""The on-disk index: build it atomically from a corpus, open it, search it section by section."""

from __future__ import annotations

from residency.index.manifest import (
    BuildProgress,
    IndexManifest,
    IndexOptions,
    manifest_hash,
    read_manifest,
)
from residency.index.store import Index, IndexRetrievers, build_index, open_index

__all__ = [
    "BuildProgress",
    "Index",
    "IndexManifest",
    "IndexOptions",
    "IndexRetrievers",
    "build_index",
    "manifest_hash",
    "open_index",
    "read_manifest",
]
