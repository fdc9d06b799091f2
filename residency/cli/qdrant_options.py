"""Qdrant flags shared by `residency serve`, `eval retrieval` and `plan` (--retriever qdrant)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from residency.cli.fields import default_of, option_from
from residency.errors import ConfigError
from residency.flags import Flag, Section
from residency.retrieval.qdrant_schema import Fusion, QdrantOptions

if TYPE_CHECKING:
    from residency.index.store import RetrievalBackend

PANEL = "Qdrant (--retriever qdrant)"
# QdrantOptions as options: --qdrant (the location: the whole model is absent without it),
# --collection, --qdrant-api-key ($QDRANT_API_KEY), --qdrant-fusion.
QDRANT_SECTION = Section(
    panel=PANEL,
    flags={
        "location": Flag("--qdrant"),
        "collection": Flag("--collection"),
        "api_key": Flag("--qdrant-api-key", envvar="QDRANT_API_KEY"),
        "fusion": Flag("--qdrant-fusion"),
    },
    skip=frozenset({"prefetch", "timeout_s"}),
)

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


def checked_qdrant(retriever: str, options: QdrantOptions | None) -> QdrantOptions | None:
    """The Qdrant options for ``--retriever qdrant`` (None otherwise); ConfigError when
    --qdrant is missing, or given to another retriever."""
    if retriever != "qdrant":
        if options is not None:
            raise ConfigError(f"--qdrant {options.location} is only read with --retriever qdrant")
        return None
    if options is None:
        raise ConfigError("--retriever qdrant needs --qdrant URL|PATH (where the collection is)")
    return options


def qdrant_backend(retriever: str, options: QdrantOptions | None) -> RetrievalBackend | None:
    """`QdrantBackend` for ``--retriever qdrant``, None for ``hybrid`` (in process)."""
    if retriever not in ("hybrid", "qdrant"):
        raise ConfigError(f"--retriever {retriever!r}: choose hybrid or qdrant")
    options = checked_qdrant(retriever, options)
    if options is None:
        return None
    from residency.index.qdrant_backend import QdrantBackend  # optional dependency

    return QdrantBackend(options)
