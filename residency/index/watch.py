"""`residency index --watch`: re-index when a corpus file is added, edited or removed.

The corpus is polled (file sizes and modification times; no inotify, so it works on network
mounts and in containers); a change is acted on once two polls agree, so an editor's
write-then-rename settles first. A re-index then compares content hashes with the manifest and
does nothing when no file's content changed (a `touch`, a save without edits). Each build is the
ordinary atomic, incremental `build_index`: readers of the index (a router reloading its plan,
`residency plan`) see the old index or the new one, never a half-written one.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

from residency.corpus.file_names import printable
from residency.errors import ConfigError
from residency.index.manifest import IndexManifest, read_manifest

WATCH_POLL_S = 1.0  # seconds between two looks at the corpus

Snapshot = dict[str, tuple[int, int]]


def _corpus_paths(root: Path) -> dict[str, Path]:
    """relpath as the loader names it (undecodable bytes escaped) -> path, non-hidden entries."""
    found: dict[str, Path] = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if not any(part.startswith(".") for part in rel.parts):
            found[printable(rel.as_posix())] = path
    return found


def corpus_snapshot(root: Path) -> Snapshot:
    """relpath -> (size, mtime_ns) of every non-hidden file under `root` (the loader's files)."""
    found: Snapshot = {}
    for rel, path in _corpus_paths(root).items():
        try:
            stat = path.stat()
        except OSError:
            continue  # removed while we looked, or a link that cannot be followed
        if path.is_file():
            found[rel] = (stat.st_size, stat.st_mtime_ns)
    return found


def content_changed(root: Path, manifest: IndexManifest) -> bool:
    """True when a file's content differs from what `manifest` indexed (added, edited, gone)."""
    indexed = {f.path: f.sha256 for f in manifest.files}
    now = corpus_snapshot(root)
    if set(now) != set(indexed):
        return True
    paths = _corpus_paths(root)
    for rel in now:
        try:
            digest = hashlib.sha256(paths[rel].read_bytes()).hexdigest()
        except (OSError, KeyError):
            return True
        if digest != indexed[rel]:
            return True
    return False


def watch_corpus(
    root: Path,
    index_dir: Path,
    rebuild: Callable[[], None],
    *,
    poll_s: float = WATCH_POLL_S,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    """Call `rebuild` after each settled change of `root` whose content differs from the index
    in `index_dir`, until `stop()` is true (the CLI stops on Ctrl-C instead)."""
    seen = corpus_snapshot(root)
    # A file edited while the index was being built, or before this first look, is already in
    # `seen`: compare the corpus with what the index holds once, so that edit is not missed.
    _rebuild_if_changed(root, index_dir, rebuild)
    while not stop():
        time.sleep(poll_s)
        now = corpus_snapshot(root)
        if now == seen:
            continue
        time.sleep(poll_s)  # settle: act once two looks agree
        settled = corpus_snapshot(root)
        if settled != now:
            continue
        seen = settled
        _rebuild_if_changed(root, index_dir, rebuild)


def _rebuild_if_changed(root: Path, index_dir: Path, rebuild: Callable[[], None]) -> None:
    """`rebuild()` when the corpus's content differs from the index's (or there is none)."""
    try:
        changed = content_changed(root, read_manifest(index_dir))
    except ConfigError:  # no readable index: build one
        changed = True
    if changed:
        rebuild()
