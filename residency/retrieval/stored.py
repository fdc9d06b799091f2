"""A retriever saved in an index directory: its metadata file, read back, and the refusal of a
query side that differs from the side it was built with (another embedder or tokenizer, another
normalisation: a silent recall drop otherwise, docs/design/retrieval.md), and the pieces that
let a build write these files in batches (an .npy header, a metadata file with streamed ids)."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

import numpy as np
import orjson
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


# numpy.lib.format's functions carry no annotations; these are their signatures.
_descr = cast("Callable[[np.dtype[Any]], str]", np.lib.format.dtype_to_descr)
_write_header = cast(
    "Callable[[BinaryIO, dict[str, Any]], None]", np.lib.format.write_array_header_1_0
)
_read_magic = cast("Callable[[BinaryIO], tuple[int, int]]", np.lib.format.read_magic)
_ReadHeader = Callable[[BinaryIO], tuple[tuple[int, ...], bool, np.dtype[Any]]]
_read_header = {
    (1, 0): cast("_ReadHeader", np.lib.format.read_array_header_1_0),
    (2, 0): cast("_ReadHeader", np.lib.format.read_array_header_2_0),
}


def npy_header(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    """The header `np.save` writes before a C-ordered array of `dtype` and `shape`, so the rows
    can follow it in batches (the file is then byte for byte what `np.save` gives)."""
    out = io.BytesIO()
    _write_header(out, {"descr": _descr(dtype), "fortran_order": False, "shape": shape})
    return out.getvalue()


def npy_data_offset(path: Path) -> tuple[int, tuple[int, ...], np.dtype[Any]]:
    """(offset of the data, shape, dtype) of a C-ordered .npy file, read from its header."""
    with path.open("rb") as f:
        version = _read_magic(f)
        if version not in _read_header:
            raise ValueError(f"{path}: .npy format version {version} is not read here")
        shape, fortran, dtype = _read_header[version](f)
        if fortran:
            raise ValueError(f"{path} holds a Fortran-ordered array")
        return f.tell(), tuple(shape), dtype


def write_meta_with_ids(path: Path, meta: BaseModel, ids_file: Path) -> None:
    """Write ``orjson.dumps(meta.model_dump())`` whose last field, ``ids``, is read from
    `ids_file` (one JSON string per line) instead of held: a million chunk ids never sit in a
    list. `meta` is built with any non-empty ``ids``; they are replaced."""
    head = orjson.dumps({**meta.model_dump(), "ids": []})
    if list(type(meta).model_fields)[-1] != "ids" or not head.endswith(b"[]}"):
        raise ValueError(f"{type(meta).__name__}: 'ids' must be its last field")
    with path.open("wb") as out, ids_file.open("rb") as ids:
        out.write(head[:-2])
        for n, line in enumerate(ids):
            out.write(line.rstrip(b"\n") if not n else b"," + line.rstrip(b"\n"))
        out.write(b"]}")
