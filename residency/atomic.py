"""Atomic writes: whole files and directories swapped in by rename, and line-atomic appends.

Readers never see a half-written artefact: a file is written to a temp file in the same
directory, fsynced and renamed over the target; a directory (an index, an imported corpus) is
built under a temp name beside the target and swapped in with one rename (Linux:
``renameat2(RENAME_EXCHANGE)``, so the target never disappears), the old tree removed only after
the swap. A build killed with SIGKILL leaves its ``.NAME.building-PID-*`` temp dir behind; it is
never read, and `remove_stale_builds` deletes it on the next build.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from residency.errors import ConfigError

_BUILD_MARK = ".building-"
_OLD_MARK = ".replaced-"


def check_output_file(path: Path, flag: str = "--output") -> None:
    """ConfigError in one line when `path` cannot be written as a file: it names a directory,
    or its directory is missing or not writable. Checked before the work that produces it, so a
    mistake costs nothing and the previous file stays."""
    if path.is_dir():
        raise ConfigError(
            f"{flag} {path} is a directory; name a file in it, e.g. {path / 'plan.json'}"
        )
    _check_parent(path, flag)


def check_output_dir(path: Path, flag: str = "--output") -> None:
    """ConfigError in one line when a directory artefact (an index, built beside `path` and
    swapped in) cannot be written there: `path` is a file, or its parent is missing or not
    writable."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file; name a directory (it is created)")
    _check_parent(path, flag)


def _check_parent(path: Path, flag: str) -> None:
    shown = f"{flag} {path}"
    parent = path.parent
    if not parent.exists():
        raise ConfigError(
            f"{shown}: the directory {parent} does not exist; create it (mkdir -p {parent}) or "
            f"choose another {flag}"
        )
    if not parent.is_dir():
        raise ConfigError(f"{shown}: {parent} is not a directory; choose another {flag}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{shown}: cannot write in {parent} (permission denied); choose another {flag}"
        )
    # Permission bits do not tell all (root, a read-only mount, an immutable directory, /proc):
    # create and remove a probe file, as the write will.
    probe = parent / f".residency-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"{shown}: cannot write in {parent} ({exc.strerror or exc}); choose another {flag}"
        ) from None


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file in the same directory and a rename; an
    OSError (a missing or read-only directory, a full disk) is one ConfigError naming the path,
    and `path` is left as it was."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(
            f"{path}: cannot write it ({exc.strerror or exc}); nothing was changed"
        ) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def append_line(path: Path, line: bytes) -> None:
    """Append one line with a single O_APPEND write, so concurrent writers never interleave."""
    data = line.rstrip(b"\n") + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, data)
        if written != len(data):  # pragma: no cover - only a full disk gets here
            raise OSError(errno.ENOSPC, f"short append to {path}: {written} of {len(data)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_builds(target: Path) -> list[Path]:
    """Delete temp dirs beside `target` left by builds whose process is gone; return them."""
    removed: list[Path] = []
    if not target.parent.is_dir():
        return removed
    for prefix in (f".{target.name}{_BUILD_MARK}", f".{target.name}{_OLD_MARK}"):
        for entry in target.parent.glob(f"{prefix}*"):
            pid_text = entry.name[len(prefix) :].split("-", 1)[0]
            if pid_text.isdigit() and _pid_alive(int(pid_text)):
                continue  # a build still running (this process's own included)
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically with renameat2(RENAME_EXCHANGE); False if unsupported."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.ENOTSUP):
        return False
    raise OSError(err, f"cannot swap {a} and {b}: {os.strerror(err)}")


def swap_directory(new: Path, target: Path) -> None:
    """Put the finished tree `new` at `target`; an existing `target` is replaced, then removed."""
    if not target.exists():
        os.rename(new, target)
        return
    if _exchange(new, target):
        shutil.rmtree(new)  # `new` now holds the old tree
        return
    old = target.with_name(f".{target.name}{_OLD_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _fsync_tree(root: Path) -> None:
    """Flush every file and directory under root, so a crash after the swap finds full files."""
    for dirpath, _, filenames in os.walk(root):
        for name in [*filenames, "."]:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


@contextlib.contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """Yield an empty temp dir beside `target`; on success swap it in, on any exception delete it.

    >>> with atomic_directory(Path("out")) as tmp:  # doctest: +SKIP
    ...     (tmp / "manifest.json").write_bytes(b"{}")   # `out` changes only here, at the exit
    """
    target = target.absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_builds(target)
    tmp = target.with_name(f".{target.name}{_BUILD_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        # Inside the try: a Ctrl-C handled on the way out of mkdir (the directory made, the
        # call not yet returned) still removes it.
        tmp.mkdir()
        yield tmp
        _fsync_tree(tmp)
        swap_directory(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def carry_over(old_dir: Path, new_dir: Path, exclude: frozenset[str]) -> None:
    """Copy `old_dir`'s top-level entries not in `exclude` into `new_dir` before a swap (files
    as hard links where possible, so an append racing the swap lands in both)."""
    if not old_dir.is_dir():
        return
    for entry in old_dir.iterdir():
        if entry.name in exclude or (new_dir / entry.name).exists():
            continue
        if entry.is_dir():
            shutil.copytree(entry, new_dir / entry.name)
            continue
        try:
            os.link(entry, new_dir / entry.name)
        except OSError:
            shutil.copy2(entry, new_dir / entry.name)


def is_build_dir(path: Path) -> bool:
    """True for a temp dir made by `atomic_directory` or `swap_directory` (never an artefact)."""
    return path.name.startswith(".") and (_BUILD_MARK in path.name or _OLD_MARK in path.name)
