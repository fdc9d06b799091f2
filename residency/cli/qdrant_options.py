"""Qdrant flags shared by `residency serve`, `eval retrieval` and `plan` (--retriever qdrant)."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from residency.errors import ConfigError

if TYPE_CHECKING:
    from residency.index.store import RetrievalBackend
    from residency.retrieval.qdrant_schema import QdrantOptions

PANEL = "Qdrant (--retriever qdrant)"


class FusionChoice(StrEnum):
    """--qdrant-fusion values."""

    rrf = "rrf"
    qdrant_rrf = "qdrant-rrf"


QdrantLocation = Annotated[
    str | None,
    typer.Option(
        "--qdrant",
        help="Qdrant server URL (http://host:6333) or a local directory (embedded mode, one "
        "process at a time) holding the index's collection.",
        rich_help_panel=PANEL,
    ),
]
QdrantCollection = Annotated[
    str | None,
    typer.Option(
        "--collection",
        help="Collection (default: the index directory's name).",
        rich_help_panel=PANEL,
    ),
]
QdrantApiKey = Annotated[
    str | None,
    typer.Option(
        "--qdrant-api-key", envvar="QDRANT_API_KEY", help="Qdrant API key.", rich_help_panel=PANEL
    ),
]
QdrantFusion = Annotated[
    FusionChoice,
    typer.Option(
        "--qdrant-fusion",
        help="rrf: residency's weighted RRF over both paths (ranks as in-process); qdrant-rrf: "
        "the server fuses (its weighted formula differs).",
        rich_help_panel=PANEL,
    ),
]


def qdrant_options(
    retriever: str,
    location: str | None,
    collection: str | None,
    api_key: str | None,
    fusion: FusionChoice,
) -> QdrantOptions | None:
    """The Qdrant options when ``--retriever qdrant``; ConfigError on a half-given pair."""
    from residency.retrieval.qdrant_schema import QdrantOptions

    if retriever != "qdrant":
        if location is not None:
            raise ConfigError(f"--qdrant {location} is only read with --retriever qdrant")
        return None
    if location is None:
        raise ConfigError("--retriever qdrant needs --qdrant URL|PATH (where the collection is)")
    return QdrantOptions(
        location=location, collection=collection, api_key=api_key, fusion=fusion.value
    )


def qdrant_backend(
    retriever: str,
    location: str | None,
    collection: str | None,
    api_key: str | None,
    fusion: FusionChoice,
) -> RetrievalBackend | None:
    """`QdrantBackend` for ``--retriever qdrant``, None for ``hybrid`` (in process)."""
    if retriever not in ("hybrid", "qdrant"):
        raise ConfigError(f"--retriever {retriever!r}: choose hybrid or qdrant")
    options = qdrant_options(retriever, location, collection, api_key, fusion)
    if options is None:
        return None
    from residency.index.qdrant_backend import QdrantBackend  # optional dependency

    return QdrantBackend(options)
