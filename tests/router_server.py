"""A real `residency serve` process for tests and benchmarks: free port, waits on /health,
fails fast with its log when it dies, stops its whole process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
from vllm_server import REPO_ROOT, free_port


class RouterProcess:
    """`python -m residency serve --plan P --upstream U... ARGS` on 127.0.0.1:<free port>."""

    def __init__(
        self,
        plan: Path,
        upstreams: Sequence[str],
        log_dir: Path,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.query_log = log_dir / f"router-{self.port}-queries.jsonl"
        self.stderr_path = log_dir / f"router-{self.port}.log"
        self.args = [
            sys.executable,
            "-m",
            "residency",
            "serve",
            "--plan",
            str(plan),
            "--port",
            str(self.port),
            "--log",
            str(self.query_log),
            "--health-interval",
            "1",
            *(a for u in upstreams for a in ("--upstream", u)),
            *extra_args,
        ]
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:<port>."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 240.0, require_healthy: bool = True) -> RouterProcess:
        """Start and wait until /health answers (200 when `require_healthy`)."""
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                self.args,
                stdout=err,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env=self.env,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"router exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status = httpx.get(f"{self.base_url}/health", timeout=2).status_code
                if status == 200 or (status == 503 and not require_healthy):
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"router not ready in {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        """The end of the router's own log."""
        try:
            return "\n".join(self.stderr_path.read_text("utf-8", "replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def __enter__(self) -> RouterProcess:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
