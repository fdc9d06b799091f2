"""The demo's child servers (launched by `residency.launcher`): the set it stops newest first,
what demo.json records of each, and signals. SIGTERM and SIGHUP to the demo itself become
`Terminated`, so `finally` blocks run as on Ctrl-C; the servers outlive the demo only with
``--keep-running`` (otherwise the kernel also stops them if the demo dies: PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from pydantic import BaseModel, ConfigDict, Field

from residency.demo.options import DemoOptions
from residency.launcher import ManagedServer


# A BaseException, like KeyboardInterrupt: no `except Exception` on the way may swallow it.
class Terminated(BaseException):
    """The demo got SIGTERM or SIGHUP: unwind (stopping every server), then exit 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


class ProcessInfo(BaseModel):
    """One server the demo started: where it listens and how to find (or stop) its processes."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str = Field(min_length=1, max_length=64, description="vllm or router.")
    pid: int = Field(ge=1, description="The leader's pid.")
    pgid: int = Field(ge=1, description="Its process group (= pid: it leads a new session).")
    url: str = Field(min_length=1, max_length=4096, description="http://127.0.0.1:PORT.")
    log: str = Field(min_length=1, max_length=4096, description="Its stdout+stderr log file.")
    command: tuple[str, ...] = Field(min_length=1, max_length=256, description="argv.")


def process_info(server: ManagedServer) -> ProcessInfo:
    """Where a spawned server runs; `RuntimeError` before `spawn`."""
    if server.pid is None:
        raise RuntimeError(f"{server.name} was never spawned")
    return ProcessInfo(
        name=server.name,
        pid=server.pid,
        pgid=server.pid,
        url=server.url,
        log=str(server.log_path),
        command=server.command,
    )


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
                out.append(process_info(server))
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


def router_command(
    options: DemoOptions, plan_path: Path, upstream: str, port: int, query_log: Path
) -> list[str]:
    """`python -m residency serve` for the demo's plan (BM25: the demo index has no vectors;
    --no-warm: the demo warms the prefix itself, in its own timed step, while the router starts,
    and two warms at once would prefill the same prefix twice)."""
    return [
        sys.executable,
        "-m",
        "residency",
        "serve",
        "--plan",
        str(plan_path),
        "--upstream",
        upstream,
        "--port",
        str(port),
        "--log",
        str(query_log),
        "--retriever",
        "bm25",
        "--today",
        options.today.isoformat(),
        "--no-warm",
    ]
