"""The demo's child servers: vLLM's CPU API server and the router, each in its own process group.

Each server is started with `start_new_session=True`, so it leads a process group that also holds
what it forks (vLLM's engine core and worker). Stopping sends SIGTERM to the whole group, then
SIGKILL after a grace period, and reaps the leader; the group is gone when `stop` returns. On
Linux a child also gets SIGTERM from the kernel if the demo dies without cleaning up
(``PR_SET_PDEATHSIG``), unless the servers are meant to outlive it (``--keep-running``).
SIGTERM and SIGHUP to the demo itself become `Terminated`, so `finally` blocks run as on Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import httpx
from pydantic import BaseModel, ConfigDict, Field

from residency.errors import UpstreamError
from residency.process_group import die_with_parent, group_alive

LOG_TAIL_LINES = 30
STOP_GRACE_S = 15.0  # vLLM's API server shuts its engine core and worker down within a few s


# A BaseException, like KeyboardInterrupt: no `except Exception` on the way may swallow it.
class Terminated(BaseException):
    """The demo got SIGTERM or SIGHUP: unwind (stopping every server), then exit 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


class ProcessInfo(BaseModel):
    """One server the demo started: where it listens and how to find (or stop) its processes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=64, description="vllm or router.")
    pid: int = Field(ge=1, description="The leader's pid.")
    pgid: int = Field(ge=1, description="Its process group (= pid: it leads a new session).")
    url: str = Field(min_length=1, max_length=4096, description="http://127.0.0.1:PORT.")
    log: str = Field(min_length=1, max_length=4096, description="Its stdout+stderr log file.")
    command: tuple[str, ...] = Field(min_length=1, max_length=256, description="argv.")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def vllm_command(
    python: Path, model_dir: Path, port: int, served_name: str, max_model_len: int
) -> list[str]:
    """`python -m vllm.entrypoints.openai.api_server` for a tiny model on the CPU build.

    The CPU wheel's `vllm` console script has no distribution metadata, hence `-m`;
    --enforce-eager skips torch.compile (server start ~25 s instead of ~60 s on 2 cores).
    """
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", served_name, "--max-model-len", str(max_model_len),
        "--enforce-eager", "--enable-prompt-tokens-details", "--enable-prefix-caching",
    ]  # fmt: skip


def vllm_env(kv_cache_space_gib: int) -> dict[str, str]:
    """The environment of the vLLM server: offline, bounded CPU KV cache, no telemetry."""
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
            # Without it the CPU worker sizes the KV cache from gpu_memory_utilization x RAM.
            "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_space_gib),
        }
    )
    return env


class ManagedServer:
    """One child server in its own process group: spawn, wait for /health, stop the group."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        port: int,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        die_with_parent: bool = True,
    ) -> None:
        self.name = name
        self.command = tuple(command)
        self.port = port
        self.log_path = log_path
        self.env = dict(env if env is not None else os.environ)
        self.cwd = cwd
        self.die_with_parent = die_with_parent
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """http://127.0.0.1:PORT (no trailing slash)."""
        return f"http://127.0.0.1:{self.port}"

    def info(self) -> ProcessInfo:
        """Where it runs; only after `spawn`."""
        if self._process is None:
            raise RuntimeError(f"{self.name} was never spawned")
        pid = self._process.pid
        return ProcessInfo(
            name=self.name,
            pid=pid,
            pgid=pid,
            url=self.url,
            log=str(self.log_path),
            command=self.command,
        )

    def spawn(self) -> None:
        """Start the process (returns at once; `wait_healthy` waits for it)."""
        if self._process is not None:
            raise RuntimeError(f"{self.name} already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            log.write(f"$ {' '.join(self.command)}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent if self.die_with_parent else None,
            )

    def wait_healthy(self, timeout_s: float) -> None:
        """Poll GET /health until 200; `UpstreamError` with the log's end if it dies or hangs."""
        process = self._process
        if process is None:
            raise RuntimeError(f"{self.name} was never spawned")
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = process.poll()
                if code is not None:
                    raise UpstreamError(
                        f"{self.name} exited with code {code} while starting "
                        f"(log: {self.log_path}):\n{self.log_tail()}"
                    )
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise UpstreamError(
                        f"{self.name} not healthy after {timeout_s:.0f} s "
                        f"(log: {self.log_path}):\n{self.log_tail()}"
                    )
                time.sleep(0.5)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of its log."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the whole group, SIGKILL what is left after `grace_s`, reap; idempotent."""
        process = self._process
        if process is None:
            return
        pgid = process.pid  # start_new_session=True: the leader's pid is the group id
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            if not group_alive(pgid):
                break
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                process.poll()  # reap the leader, or the group never empties of its zombie
                if not group_alive(pgid):
                    break
                time.sleep(0.1)
        if process.poll() is None:
            process.wait(timeout=5)
        self._process = None


class ServerSet:
    """The servers of one demo run; `stop_all` stops them newest first, ignoring Ctrl-C/SIGTERM."""

    def __init__(self) -> None:
        self.servers: list[ManagedServer] = []

    def add(self, server: ManagedServer) -> ManagedServer:
        """Track `server` (before spawning it, so a failed start is still stopped)."""
        self.servers.append(server)
        return server

    def infos(self) -> list[ProcessInfo]:
        """Every spawned server's ProcessInfo."""
        out: list[ProcessInfo] = []
        for server in self.servers:
            try:
                out.append(server.info())
            except RuntimeError:
                continue
        return out

    def stop_all(self) -> None:
        """Stop every server; a second signal during the stop does not cut it short."""
        with _signals_ignored():
            while self.servers:
                self.servers.pop().stop()

    def detach(self) -> list[ProcessInfo]:
        """Forget the servers (they keep running) and return where they are."""
        infos = self.infos()
        self.servers.clear()
        return infos


@contextmanager
def terminate_on_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise `Terminated` (main thread only; else no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, frame: FrameType | None) -> None:
        raise Terminated(signum)

    previous = {
        sig: signal.signal(sig, raise_terminated) for sig in (signal.SIGTERM, signal.SIGHUP)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def _signals_ignored() -> Iterator[None]:
    """Ignore SIGINT, SIGTERM and SIGHUP for the block (main thread only; else no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
