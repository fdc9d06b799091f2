"""Query vectors kept on disk, keyed by embedder and text, so that re-planning from an unchanged
(or grown) query log embeds only the questions it has not seen.

One SQLite file (stdlib, safe for several processes) under the cache directory: key =
sha256 of ``embedder name \\0 normalisation version \\0 normalised text``, value = the float32
vector. A question asked again by any log, plan or eval with the same embedder is a lookup. The
oldest-used rows go past `MAX_ROWS` (about 300 MB of 384-d vectors).
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from residency.normalize import NORMALIZATION_VERSION, normalize_text
from residency.retrieval.embedders import Embedder

CACHE_FILE = "query-vectors.sqlite3"
MAX_ROWS = 200_000
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS vectors "
    "(key TEXT PRIMARY KEY, dim INTEGER NOT NULL, vector BLOB NOT NULL, used REAL NOT NULL)"
)
_CHUNK = 500  # keys per SELECT (SQLite caps bound parameters)


def query_key(embedder_name: str, text: str) -> str:
    """The cache key of one query text for one embedder."""
    raw = f"{embedder_name}\0{NORMALIZATION_VERSION}\0{normalize_text(text)}"
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


class QueryVectorCache:
    """Query vectors of any embedder in one SQLite file (created on first write)."""

    def __init__(self, path: Path, max_rows: int = MAX_ROWS) -> None:
        if max_rows <= 0:
            raise ValueError(f"max_rows must be positive, got {max_rows}")
        self.path = path
        self.max_rows = max_rows

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=30.0)
        db.execute(_SCHEMA)
        return db

    def get(self, keys: Sequence[str], dim: int) -> dict[str, NDArray[np.float32]]:
        """The stored vectors of those `keys` that are there (and of this dimension)."""
        if not keys or not self.path.is_file():
            return {}
        found: dict[str, NDArray[np.float32]] = {}
        with closing(self._connect()) as db, db:
            for start in range(0, len(keys), _CHUNK):
                part = list(keys[start : start + _CHUNK])
                marks = ",".join("?" * len(part))
                rows = db.execute(
                    f"SELECT key, vector FROM vectors WHERE dim = ? AND key IN ({marks})",
                    [dim, *part],
                )
                for key, blob in rows:
                    found[key] = np.frombuffer(blob, dtype=np.float32).copy()
            now = time.time()
            db.executemany("UPDATE vectors SET used = ? WHERE key = ?", [(now, k) for k in found])
        return found

    def put(self, vectors: dict[str, NDArray[np.float32]]) -> None:
        """Store vectors by key, then drop the least recently used rows past `max_rows`."""
        if not vectors:
            return
        now = time.time()
        rows = [
            (k, int(v.shape[0]), np.ascontiguousarray(v, np.float32).tobytes(), now)
            for k, v in vectors.items()
        ]
        with closing(self._connect()) as db, db:
            db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?, ?)", rows)
            (count,) = db.execute("SELECT COUNT(*) FROM vectors").fetchone()
            if count > self.max_rows:
                db.execute(
                    "DELETE FROM vectors WHERE key IN "
                    "(SELECT key FROM vectors ORDER BY used LIMIT ?)",
                    (count - self.max_rows,),
                )


def embed_queries_cached(
    embedder: Embedder, texts: Sequence[str], cache: QueryVectorCache
) -> tuple[NDArray[np.float32], int]:
    """(vectors of `texts` in order, how many distinct texts were embedded now): the rest come
    from `cache`, and what was embedded is stored there."""
    keys = [query_key(embedder.name, t) for t in texts]
    text_of = dict(zip(keys, texts, strict=True))
    known = cache.get(list(text_of), embedder.dim)
    todo = [k for k in text_of if k not in known]
    if todo:
        fresh = embedder.embed_queries([text_of[k] for k in todo])
        new = {k: fresh[i] for i, k in enumerate(todo)}
        cache.put(new)
        known.update(new)
    out = np.empty((len(texts), embedder.dim), dtype=np.float32)
    for row, key in enumerate(keys):
        out[row] = known[key]
    return out, len(todo)
