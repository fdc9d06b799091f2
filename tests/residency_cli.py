"""`residency ARGS` as a user runs it (from the repository root), for the tests that drive the CLI.

By default the CLI's own entry point (`residency.cli.main`, its one-line error mapping included)
runs in this process with stdout, stderr and argv swapped in: an interpreter start and the CLI's
imports cost ~2 s of CPU per call on 2 cores, and the suite makes hundreds of them. Commands that
keep running (`serve`, `demo`, `--watch`) always run in a child process, as does everything when
RESIDENCY_TEST_CLI_SUBPROCESS=1.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
_LONG_RUNNING = frozenset({"serve", "demo", "status"})  # status: an event loop and sockets


def _in_process(args: tuple[str, ...]) -> bool:
    if os.environ.get("RESIDENCY_TEST_CLI_SUBPROCESS") == "1":
        return False
    return not (set(args[:2]) & _LONG_RUNNING or "--watch" in args)


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the CLI to the end; stdout and stderr as text. Wide output (COLUMNS=250, as
    conftest sets): rich never wraps a phrase a test looks for at a long tmp path."""
    if not _in_process(args):
        return subprocess.run(
            [sys.executable, "-m", "residency", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO_ROOT,
            env={**os.environ, "COLUMNS": os.environ.get("COLUMNS", "250")},
        )
    return run_main(*args)


def run_main(*args: str) -> subprocess.CompletedProcess[str]:
    """`residency.cli.main` with argv = ARGS in this process, from the repository root: the exit
    code, stdout and stderr a child's would have (a bug's traceback included)."""
    from residency.cli import main

    # Text streams over bytes: click's echo writes bytes (orjson's output) to `.buffer`.
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    code: int | str | None = 0
    argv, cwd = sys.argv, Path.cwd()
    sys.argv = ["residency", *args]
    os.chdir(REPO_ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # a bug: shown as a child's traceback would be
        err.write("Traceback (most recent call last):\n" + traceback.format_exc())
        code = 1
    finally:
        sys.argv = argv
        os.chdir(cwd)
    if isinstance(code, str):  # sys.exit("message")
        err.write(code + "\n")
        code = 1
    texts = [stream.buffer.getvalue().decode("utf-8", "replace") for stream in (out, err)]  # type: ignore[attr-defined]
    return subprocess.CompletedProcess(list(args), int(code or 0), *texts)
