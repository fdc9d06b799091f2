"""A real `residency serve` process for tests and benchmarks, launched like the demo's router
(`residency.launcher`): free port, waits on /health, fails fast with its log when it dies,
stops its whole process group."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from vllm_server import REPO_ROOT

from residency.launcher import ManagedServer, free_port

STOP_SEQUENCE = ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0))


class RouterProcess(ManagedServer):
    """`python -m residency serve --plan P --upstream U... ARGS` on 127.0.0.1:<free port>."""

    def __init__(
        self,
        plan: Path,
        upstreams: Sequence[str],
        log_dir: Path,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        port = free_port()
        self.query_log = log_dir / f"router-{port}-queries.jsonl"
        command = [
            sys.executable,
            "-m",
            "residency",
            "serve",
            "--plan",
            str(plan),
            "--port",
            str(port),
            "--log",
            str(self.query_log),
            "--health-interval",
            "1",
            *(a for u in upstreams for a in ("--upstream", u)),
            *extra_args,
        ]
        super().__init__(
            "router",
            command,
            port=port,
            log_path=log_dir / f"router-{port}.log",
            env={**os.environ, **(env or {})},
            cwd=REPO_ROOT,
            stop_at_exit=True,
            stop_sequence=STOP_SEQUENCE,
        )

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:<port>."""
        return self.url

    def start(self, timeout_s: float = 240.0, require_healthy: bool = True) -> RouterProcess:
        """Start and wait until /health answers (200 when `require_healthy`, else 503 too)."""
        super().start(timeout_s, accept_unavailable=not require_healthy)
        return self

    def __enter__(self) -> RouterProcess:
        return self if self.pid is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
