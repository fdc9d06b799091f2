"""A BM25-only index of hand-written sections ({id: (title, text)}, one .jsonl file) or of
hand-written files: the routing and planning tests' small corpora."""

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
    records = [orjson.dumps({"id": k, "title": t, "text": x}) for k, (t, x) in sections.items()]
    return docs_index(root, {"manual.jsonl": (b"\n".join(records) + b"\n").decode()}, tokenizer_dir)


def docs_index(root: Path, files: Mapping[str, str], tokenizer_dir: Path) -> Index:
    """Write `files` ({name: text}) under root/docs, index them (no dense), open the index."""
    docs = root / "docs"
    docs.mkdir()
    for name, text in files.items():
        (docs / name).write_text(text, "utf-8")
    build_index(docs, root / "index", IndexOptions(dense=False), LocalTokenizer(tokenizer_dir))
    return open_index(root / "index")
