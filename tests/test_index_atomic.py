"""Atomic writes under the index: files, directory swaps, stale build dirs, line appends."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from residency.atomic import (
    append_line,
    atomic_directory,
    carry_over,
    is_build_dir,
    remove_stale_builds,
    swap_directory,
    write_bytes_atomic,
)


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_write_bytes_atomic_replaces_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    write_bytes_atomic(target, b"old")
    write_bytes_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert names(tmp_path) == ["plan.json"]


def test_write_bytes_atomic_failure_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    target.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_bytes_atomic(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert names(tmp_path) == ["plan.json"]


def _append_many(path: str, writer: int, lines: int) -> None:
    for i in range(lines):
        payload = {"writer": writer, "i": i, "pad": "灯" * 3000}  # ~9 KB per line
        append_line(Path(path), json.dumps(payload, ensure_ascii=False).encode())


def test_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(path), w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert sorted((r["writer"], r["i"]) for r in records) == [
        (w, i) for w in range(4) for i in range(40)
    ]


def test_atomic_directory_swaps_in_a_finished_tree(tmp_path: Path) -> None:
    target = tmp_path / "idx"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with atomic_directory(target) as tmp:
        (tmp / "new.txt").write_text("new")
        assert names(target) == ["old.txt"]  # untouched until the block ends
        assert is_build_dir(tmp)
    assert names(target) == ["new.txt"]
    assert names(tmp_path) == ["idx"]


def test_atomic_directory_discards_the_tree_on_error(tmp_path: Path) -> None:
    target = tmp_path / "idx"
    target.mkdir()
    (target / "old.txt").write_text("old")

    def interrupted_build() -> None:
        with atomic_directory(target) as tmp:
            (tmp / "half.txt").write_text("half")
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted_build()
    assert names(target) == ["old.txt"]
    assert names(tmp_path) == ["idx"]


def test_swap_directory_into_a_new_path(tmp_path: Path) -> None:
    new = tmp_path / "new"
    new.mkdir()
    (new / "a").write_text("a")
    swap_directory(new, tmp_path / "target")
    assert names(tmp_path) == ["target"]
    assert (tmp_path / "target/a").read_text() == "a"


def test_stale_build_dirs_of_dead_processes_are_removed(tmp_path: Path) -> None:
    dead = tmp_path / ".idx.building-999999999-abcd"
    alive = tmp_path / f".idx.building-{os.getpid()}-abcd"
    other = tmp_path / ".other.building-999999999-abcd"
    for d in (dead, alive, other):
        d.mkdir()
    removed = remove_stale_builds(tmp_path / "idx")
    assert removed == [dead]
    assert names(tmp_path) == sorted([alive.name, other.name])


def test_carry_over_keeps_user_entries_only(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    (old / "notes").mkdir(parents=True)
    (old / "notes/n.txt").write_text("n")
    (old / "history.jsonl").write_text("h\n")
    (old / "manifest.json").write_text("{}")
    new.mkdir()
    carry_over(old, new, exclude=frozenset({"manifest.json"}))
    assert names(new) == ["history.jsonl", "notes"]
    assert (new / "notes/n.txt").read_text() == "n"
