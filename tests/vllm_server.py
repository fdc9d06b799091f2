"""A real vLLM OpenAI-compatible server in a child process group, for tests and experiments.

    with VllmServer(model_dir, log_path=tmp / "vllm.log", max_model_len=32768) as server:
        httpx.get(f"{server.base_url}/v1/models")

The server gets a free loopback port, its own process group (vLLM forks an engine core and a
worker), a log file, and offline settings (HF_HUB_OFFLINE=1). `start()` waits for GET /health
and raises `VllmServerError` with the last log lines as soon as the process dies or the timeout
passes; `stop()` sends SIGINT, then SIGTERM, then SIGKILL to the whole group and waits, so no
process outlives the block.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx

from residency.process_group import die_with_parent
from residency.process_group import group_alive as process_group_alive

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PYTHON = Path(sys.executable)
LOG_TAIL_LINES = 40
# "RuntimeError: ...", "ValueError: ...", "torch.OutOfMemoryError: ..." as a line of its own.
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")


class _Default:
    """Marks an argument left at the factory's default (None is a meaningful value)."""


_DEFAULT = _Default()


class VllmServerError(RuntimeError):
    """The vLLM server failed to start, died, or did not become healthy in time."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def server_env(kv_cache_space_gib: int | None = 1, dev_mode: bool = True) -> dict[str, str]:
    """The environment a tiny-model CPU server runs with (offline, bounded KV cache)."""
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
            # On 2 cores vLLM's "auto" binding puts the worker's OpenMP threads on core 0 and
            # leaves core 1 to the API server and engine core; it is also the default.
            "VLLM_CPU_OMP_THREADS_BIND": env.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        }
    )
    if kv_cache_space_gib is not None:
        # Without it the CPU worker sizes the KV cache from gpu_memory_utilization x RAM.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_space_gib)
    if dev_mode:
        # Enables /reset_prefix_cache, /sleep and friends.
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


class VllmServer:
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
        self.model_dir = model_dir
        self.log_path = log_path
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len
        self.port = port if port is not None else free_port()
        self.startup_timeout_s = startup_timeout_s
        self.env = server_env(kv_cache_space_gib, dev_mode)
        self.env.update(env or {})
        self.command: list[str] = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            served_model_name,
            "--max-model-len",
            str(max_model_len),
            *extra_args,
        ]
        self.startup_s: float | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT (no trailing slash, no /v1)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The API server's pid (also its process group id), or None when not started."""
        return self._process.pid if self._process is not None else None

    def log_text(self) -> str:
        """Everything the server has written to its log so far."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of the log, for error messages."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def failure_report(self) -> str:
        """The root-cause lines (``...Error: ...``) of the log, then its last lines."""
        causes: list[str] = []
        for line in self.log_text().splitlines():
            cause = line.split("] ", 1)[-1].strip()
            if _ERROR_LINE.match(cause) and cause not in causes:
                causes.append(cause)
        head = "root cause(s):\n" + "\n".join(causes[-5:]) + "\n" if causes else ""
        return f"{head}last {LOG_TAIL_LINES} log lines:\n{self.log_tail()}"

    def start(self) -> VllmServer:
        """Launch the server and block until /health answers 200; raise if it dies or hangs."""
        if self._process is not None:
            raise VllmServerError("server already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            log.write(f"$ {' '.join(self.command)}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                self.command,
                cwd=REPO_ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        atexit.register(self.stop)  # an interpreter that exits early still stops its servers
        try:
            self._wait_healthy(started)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def _wait_healthy(self, started: float) -> None:
        """Poll /health until 200, the process exits, or the startup timeout passes."""
        assert self._process is not None
        deadline = started + self.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self._process.poll()
                if code is not None:
                    raise VllmServerError(
                        f"vLLM server exited with code {code} during startup "
                        f"(log: {self.log_path})\n{self.failure_report()}"
                    )
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise VllmServerError(
                        f"vLLM server not healthy after {self.startup_timeout_s:.0f} s "
                        f"(log: {self.log_path})\n{self.failure_report()}"
                    )
                time.sleep(0.5)

    def stop(self) -> None:
        """Stop the whole process group: SIGINT, then SIGTERM, then SIGKILL; idempotent."""
        process = self._process
        if process is None:
            return
        pgid = process.pid  # start_new_session=True: the server leads its own group
        for sig, grace_s in ((signal.SIGINT, 15.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if not process_group_alive(pgid):
                break
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                process.poll()  # reap the leader so the group can empty
                if not process_group_alive(pgid):
                    break
                time.sleep(0.2)
        process.poll()
        if process.returncode is None:
            process.wait(timeout=5)
        self._process = None
        atexit.unregister(self.stop)

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
