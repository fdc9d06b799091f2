"""The --retriever qdrant rule shared by `residency plan` and `eval retrieval`: --qdrant goes with
it, and the in-process backend it opens."""

from __future__ import annotations

from typing import TYPE_CHECKING

from residency.errors import ConfigError
from residency.retrieval.qdrant_schema import QdrantOptions

if TYPE_CHECKING:
    from residency.index.store import RetrievalBackend


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
