"""A BM25-only index of hand-written sections ({id: (title, text)}), one .jsonl file: the
routing tests' small corpora."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import orjson

from residency.index import Index, IndexOptions, build_index, open_index
from residency.tokenizer import LocalTokenizer


def section_index(
    root: Path, sections: Mapping[str, tuple[str, str]], tokenizer_dir: Path
) -> Index:
    """Write `sections` as docs/manual.jsonl under `root`, index it (no dense), open it."""
    (root / "docs").mkdir()
    records = [orjson.dumps({"id": k, "title": t, "text": x}) for k, (t, x) in sections.items()]
    (root / "docs" / "manual.jsonl").write_bytes(b"\n".join(records) + b"\n")
    build_index(
        root / "docs", root / "index", IndexOptions(dense=False), LocalTokenizer(tokenizer_dir)
    )
    return open_index(root / "index")
