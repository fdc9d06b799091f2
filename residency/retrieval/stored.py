"""A retriever saved in an index directory: its metadata file, read back, and the refusal of a
query side that differs from the side it was built with (another embedder or tokenizer, another
normalisation: a silent recall drop otherwise, docs/design/retrieval.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from residency.errors import ConfigError
from residency.normalize import NORMALIZATION_VERSION

Meta = TypeVar("Meta", bound=BaseModel)


def read_meta(directory: Path, meta_file: str, model: type[Meta], kind: str) -> Meta:
    """The metadata of the `kind` index ('dense', 'BM25') saved in `directory`."""
    meta_path = directory / meta_file
    if not meta_path.is_file():
        raise ConfigError(f"no {kind} index in {str(directory)!r} ({meta_file} missing)")
    return model.model_validate_json(meta_path.read_bytes())


def check_query_side(
    directory: Path, kind: str, role: str, built: str, normalization: str, used: str
) -> None:
    """`ConfigError` unless the query side's `role` ('embedder', 'tokenizer') and the
    normalisation are those the index was built with."""
    if built != used or normalization != NORMALIZATION_VERSION:
        raise ConfigError(
            f"{kind} index in {str(directory)!r} was built with {role} {built!r} "
            f"and normalisation {normalization!r}; this query side uses "
            f"{used!r} and {NORMALIZATION_VERSION!r} (rebuild the index or "
            f"pass the index's {role})"
        )
