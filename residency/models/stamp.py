"""The stamp file of a built model directory: the hash of what it was built from, so an
identical build is skipped (`residency-tiny-model.json`, `residency-model.json`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def stamp_hash(model_dir: Path, stamp_file: str) -> str | None:
    """The build hash recorded in model_dir, or None when there is no complete build."""
    try:
        stamp = json.loads((model_dir / stamp_file).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    value = stamp.get("build_hash") if isinstance(stamp, dict) else None
    return value if isinstance(value, str) else None


def write_stamp(model_dir: Path, stamp_file: str, stamp: dict[str, Any]) -> None:
    """Record `stamp` (with its "build_hash") as the directory's last file."""
    (model_dir / stamp_file).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
