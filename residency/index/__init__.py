"""The index: build it atomically from a corpus (chunks, BM25, dense vectors, manifest), open it,
search it section by section. The index directory is what every later stage reads.

May import: the cross-cutting modules, corpus, retrieval.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from residency.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from residency.index.build import build_index
    from residency.index.manifest import (
        BuildProgress,
        IndexManifest,
        manifest_hash,
        read_manifest,
    )
    from residency.index.options import IndexOptions
    from residency.index.store import Index, IndexRetrievers, open_index

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

__getattr__ = lazy_exports(__name__, __file__)
