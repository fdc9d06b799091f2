"""A real vLLM OpenAI-compatible server in a child process group, for tests and experiments: the
library's launcher (`residency.launcher`, which the demo uses too) with the suite's defaults.

    with VllmServer(model_dir, log_path=tmp / "vllm.log", max_model_len=32768) as server:
        VllmClient(server.base_url).models()

The server gets a free loopback port, its own process group (vLLM forks an engine core and a
worker), a log file, and offline settings (HF_HUB_OFFLINE=1) with VLLM_SERVER_DEV_MODE=1.
`start()` waits for GET /health and raises `VllmServerError` with the root causes and last log
lines as soon as the process dies or the timeout passes; `stop()` sends SIGINT, then SIGTERM,
then SIGKILL to the whole group and waits, so no process outlives the block.
"""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from residency.launcher import ManagedServer, ServerStartError, free_port, vllm_command, vllm_env
from residency.launcher import group_alive as process_group_alive

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PYTHON = Path(sys.executable)
# SIGINT first: vLLM's API server then shuts its engine core and worker down as on Ctrl-C.
STOP_SEQUENCE = ((signal.SIGINT, 15.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0))

__all__ = [
    "REPO_ROOT",
    "VllmServer",
    "VllmServerError",
    "VllmServerFactory",
    "free_port",
    "process_group_alive",
    "server_env",
]

VllmServerError = ServerStartError


def server_env(kv_cache_space_gib: int | None = 1, dev_mode: bool = True) -> dict[str, str]:
    """The environment a tiny-model CPU server runs with (offline, bounded KV cache, dev mode)."""
    return vllm_env(kv_cache_space_gib, dev_mode)


class _Default:
    """Marks an argument left at the factory's default (None is a meaningful value)."""


_DEFAULT = _Default()


class VllmServer(ManagedServer):
    """`python -m vllm.entrypoints.openai.api_server` on a free port, as a context manager."""

    def __init__(
        self,
        model_dir: Path,
        *,
        log_path: Path,
        served_model_name: str = "tiny",
        max_model_len: int = 32768,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        kv_cache_space_gib: int | None = 1,
        dev_mode: bool = True,
        python: Path = DEFAULT_PYTHON,
        startup_timeout_s: float = 420.0,
        port: int | None = None,
    ) -> None:
        port = port if port is not None else free_port()
        self.model_dir = model_dir
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len
        self.startup_timeout_s = startup_timeout_s
        super().__init__(
            "vLLM server",
            vllm_command(python, model_dir, port, served_model_name, max_model_len, extra_args),
            port=port,
            log_path=log_path,
            env={**server_env(kv_cache_space_gib, dev_mode), **(env or {})},
            cwd=REPO_ROOT,
            stop_at_exit=True,
            stop_sequence=STOP_SEQUENCE,
        )

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT (no trailing slash, no /v1)."""
        return self.url

    def start(self, timeout_s: float | None = None) -> VllmServer:
        """Launch the server and block until /health answers 200; raise if it dies or hangs."""
        super().start(timeout_s if timeout_s is not None else self.startup_timeout_s)
        return self

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class VllmServerFactory:
    """Starts VllmServers with shared defaults and stops every one of them in `close()`."""

    def __init__(
        self,
        log_dir: Path,
        *,
        python: Path = DEFAULT_PYTHON,
        served_model_name: str = "tiny",
        max_model_len: int = 32768,
        kv_cache_space_gib: int | None = 1,
        extra_args: Sequence[str] = (),
        before_start: Callable[[], None] | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.python = python
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len
        self.kv_cache_space_gib = kv_cache_space_gib
        self.extra_args = tuple(extra_args)
        self.before_start = before_start
        self.servers: list[VllmServer] = []

    def __call__(
        self,
        model_dir: Path,
        *,
        extra_args: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        max_model_len: int | None = None,
        kv_cache_space_gib: int | _Default | None = _DEFAULT,
        name: str | None = None,
        served_model_name: str | None = None,
    ) -> VllmServer:
        """Start a server for model_dir (the factory's defaults unless given) and wait for it."""
        if self.before_start is not None:
            self.before_start()
        label = re.sub(r"[^\w.-]", "_", name or model_dir.name)
        server = VllmServer(
            model_dir,
            log_path=self.log_dir / f"{label}-{len(self.servers)}.log",
            served_model_name=served_model_name or self.served_model_name,
            max_model_len=max_model_len if max_model_len is not None else self.max_model_len,
            extra_args=self.extra_args if extra_args is None else tuple(extra_args),
            env=env,
            kv_cache_space_gib=(
                self.kv_cache_space_gib
                if isinstance(kv_cache_space_gib, _Default)
                else kv_cache_space_gib
            ),
            python=self.python,
        )
        self.servers.append(server)
        return server.start()

    def close(self) -> None:
        """Stop all servers started by this factory, newest first."""
        while self.servers:
            self.servers.pop().stop()
