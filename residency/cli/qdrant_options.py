"""Qdrant flags shared by `residency serve`, `eval retrieval` and `plan` (--retriever qdrant)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from residency.cli.fields import default_of, option_from
from residency.errors import ConfigError
from residency.retrieval.qdrant_schema import Fusion, QdrantOptions

if TYPE_CHECKING:
    from residency.index.store import RetrievalBackend

PANEL = "Qdrant (--retriever qdrant)"

QdrantLocation = Annotated[
    str | None, option_from(QdrantOptions, "location", "--qdrant", rich_help_panel=PANEL)
]
QdrantCollection = Annotated[
    str | None, option_from(QdrantOptions, "collection", "--collection", rich_help_panel=PANEL)
]
QdrantApiKey = Annotated[
    str | None,
    option_from(
        QdrantOptions, "api_key", "--qdrant-api-key", envvar="QDRANT_API_KEY", rich_help_panel=PANEL
    ),
]
QdrantFusion = Annotated[
    Fusion, option_from(QdrantOptions, "fusion", "--qdrant-fusion", rich_help_panel=PANEL)
]
DEFAULT_FUSION: Fusion = default_of(QdrantOptions, "fusion")


def qdrant_options(
    retriever: str,
    location: str | None,
    collection: str | None,
    api_key: str | None,
    fusion: Fusion,
) -> QdrantOptions | None:
    """The Qdrant options when ``--retriever qdrant``; ConfigError on a half-given pair."""
    if retriever != "qdrant":
        if location is not None:
            raise ConfigError(f"--qdrant {location} is only read with --retriever qdrant")
        return None
    if location is None:
        raise ConfigError("--retriever qdrant needs --qdrant URL|PATH (where the collection is)")
    return QdrantOptions(location=location, collection=collection, api_key=api_key, fusion=fusion)


def qdrant_backend(
    retriever: str,
    location: str | None,
    collection: str | None,
    api_key: str | None,
    fusion: Fusion,
) -> RetrievalBackend | None:
    """`QdrantBackend` for ``--retriever qdrant``, None for ``hybrid`` (in process)."""
    if retriever not in ("hybrid", "qdrant"):
        raise ConfigError(f"--retriever {retriever!r}: choose hybrid or qdrant")
    options = qdrant_options(retriever, location, collection, api_key, fusion)
    if options is None:
        return None
    from residency.index.qdrant_backend import QdrantBackend  # optional dependency

    return QdrantBackend(options)
